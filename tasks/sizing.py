"""Cost estimates from a meta-device trace, and re-sizing a task's shape parameters toward a target time.

Roofline-style estimate of unfused eager time: every non-view aten op costs a fixed launch/dispatch
overhead plus the larger of its bytes over memory bandwidth and its FLOPs over arithmetic throughput
(matmul-like and convolution FLOPs at different rates). The constants are stated below; they are estimates,
not measurements, and tasks sized with them say so in their metadata (`eager_ms_source`).

`resize_for_target` doubles shape parameters (batch first, then the others in turn; doubling keeps every
divisibility a composed task relies on) until the estimate reaches the target.
"""

from __future__ import annotations

from dataclasses import dataclass

from tasks.trace import TraceResult, canonical_op


@dataclass(frozen=True)
class DeviceModel:
    """Throughputs of one device for the estimate.

    Fields:
      name: label recorded with estimates.
      mem_gbps: sustained memory bandwidth, GB/s.
      matmul_tflops: dense matmul throughput (fp32 as eager runs it), TFLOP/s.
      conv_tflops: convolution throughput, TFLOP/s.
      other_tflops: throughput for FLOPs of other ops (attention counted here), TFLOP/s.
      op_overhead_us: fixed cost per dispatched op (kernel launch / dispatcher), microseconds.
      memory_bytes: device memory the task's tensors may use.
    """

    name: str
    mem_gbps: float
    matmul_tflops: float
    conv_tflops: float
    other_tflops: float
    op_overhead_us: float
    memory_bytes: int


# H200 SXM: 4.8 TB/s HBM3e peak (about 4 TB/s sustained); fp32 SIMT peak about 67 TFLOP/s (cuBLAS SGEMM reaches
# about 50 with TF32 off, torch's default for matmul); cuDNN convolutions use TF32 by default (allow_tf32=True).
H200 = DeviceModel("h200-estimate", mem_gbps=4000.0, matmul_tflops=50.0, conv_tflops=150.0, other_tflops=50.0,
                   op_overhead_us=6.0, memory_bytes=24 << 30)
# One core of a 2-core CI machine (AVX2): rough figures, used only for ratios between sizes of a task.
CPU_CORE = DeviceModel("cpu-core-estimate", mem_gbps=3.0, matmul_tflops=0.05, conv_tflops=0.03, other_tflops=0.01,
                       op_overhead_us=8.0, memory_bytes=2 << 30)


def estimate_ms(tr: TraceResult, dev: DeviceModel) -> float:
    """Estimated eager time of one forward, ms (see the module docstring)."""
    total_us = 0.0
    for r in tr.ops:
        fam = canonical_op(r.name)
        rate = dev.matmul_tflops if fam == "matmul" else dev.conv_tflops if fam == "conv" else dev.other_tflops
        total_us += dev.op_overhead_us + max(r.bytes / (dev.mem_gbps * 1e3), r.flops / (rate * 1e6))
    return total_us / 1e3


def footprint_bytes(tr: TraceResult) -> int:
    """Rough peak memory of one forward: inputs + parameters + the two largest op footprints."""
    return tr.input_bytes + tr.param_bytes + 2 * tr.max_op_bytes


def trace_with(source: str, params: dict[str, int], origin: str) -> TraceResult:
    """Meta-device trace of the source with its shape parameters set to `params`."""
    from tasks.reference import load_module, with_shape_params
    from tasks.trace import trace_module

    return trace_module(load_module(with_shape_params(source, params, origin), origin), device="meta")


def scale_order(params: dict[str, int]) -> list[str]:
    """Which parameters to double, in turn: batch-like names first, then the rest in source order."""
    first = [k for k in params if "batch" in k.lower()]
    return first + [k for k in params if k not in first]


def resize_for_target(source: str, params: dict[str, int], target_ms: float, dev: DeviceModel,
                      origin: str = "<reference>", base_ms: float | None = None, max_doublings: int = 24,
                      ) -> tuple[dict[str, int], float]:
    """Double shape parameters until the estimate reaches `target_ms`, within the device memory.

    With `base_ms` (a measured time at `params`), estimates are scaled by measured/estimated at the base size,
    so the device model only has to get ratios right. Returns (new params, estimated ms). Parameters whose
    value is below 2 are left alone (they are structural: kernel sizes of 1, flags).
    """
    order = [k for k in scale_order(params) if params[k] >= 2]
    cur = dict(params)
    tr = trace_with(source, cur, origin)
    est0 = estimate_ms(tr, dev)
    calib = (base_ms / est0) if (base_ms and est0 > 0) else 1.0
    est = est0 * calib
    i = 0
    while est < target_ms and order and i < max_doublings:
        k = order[i % len(order)]
        trial = dict(cur)
        trial[k] = cur[k] * 2
        i += 1
        try:
            tr2 = trace_with(source, trial, origin)
        except Exception:  # this parameter cannot double (a structural constant): stop scaling it
            order.remove(k)
            continue
        if footprint_bytes(tr2) > dev.memory_bytes:
            order.remove(k)
            continue
        cur, tr = trial, tr2
        est = estimate_ms(tr, dev) * calib
    return cur, est
