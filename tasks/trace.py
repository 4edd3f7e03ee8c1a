"""Record the aten operators a reference runs, with their FLOPs and bytes moved.

The normalised operator sequence of a task (for near-duplicate and contamination checks) is the list of aten
operator names its forward dispatches, with views, aliases and bookkeeping ops left out, so `F.relu(x)`,
`torch.relu(x)` and `nn.ReLU()(x)` all read `relu`. Tracing runs on the `meta` device by default: no memory
is allocated and no arithmetic is done, so even GPU-sized references trace in milliseconds on a CPU.

FLOPs come from `torch.utils.flop_counter`'s formulas (matmul, conv, attention); bytes are the sizes of every
tensor argument and result of each non-view op (an upper bound on eager traffic, since eager runs one kernel
per op and does not fuse).
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field
from typing import Any

# Ops that do no arithmetic and say nothing about what a task computes.
IGNORED_OPS = frozenset(
    {
        "detach", "alias", "lift_fresh", "lift_fresh_copy", "empty", "empty_like", "empty_strided",
        "new_empty", "new_empty_strided", "_local_scalar_dense", "_to_copy", "clone", "copy_",
        "contiguous", "resize_", "set_", "zeros", "ones", "zeros_like", "ones_like", "full", "scalar_tensor",
        "_unsafe_view", "randn", "rand", "normal_", "uniform_", "randint", "arange", "fill_", "zero_",
    }
)


_CANONICAL_PREFIXES = (
    ("_scaled_dot_product", "sdpa"),
    ("scaled_dot_product", "sdpa"),
    ("_native_batch_norm", "batch_norm"),
    ("native_batch_norm", "batch_norm"),
    ("cudnn_batch_norm", "batch_norm"),
    ("_batch_norm", "batch_norm"),
    ("max_pool", "max_pool"),
    ("avg_pool", "avg_pool"),
    ("adaptive_avg_pool", "adaptive_avg_pool"),
    ("_adaptive_avg_pool", "adaptive_avg_pool"),
    ("adaptive_max_pool", "adaptive_max_pool"),
)
_CANONICAL = {
    "addmm": "matmul", "mm": "matmul", "bmm": "matmul", "baddbmm": "matmul", "addbmm": "matmul",
    "matmul": "matmul", "linear": "matmul", "einsum": "matmul",
    "convolution": "conv", "_convolution": "conv", "mkldnn_convolution": "conv", "cudnn_convolution": "conv",
    "conv2d": "conv", "conv1d": "conv", "conv3d": "conv", "_slow_conv2d_forward": "conv",
    "convolution_overrideable": "conv", "slow_conv3d_forward": "conv", "slow_conv_transpose2d": "conv",
    "native_layer_norm": "layer_norm", "native_group_norm": "group_norm", "_softmax": "softmax",
    "_log_softmax": "log_softmax", "_fused_rms_norm": "rms_norm",
}


def canonical_op(name: str) -> str:
    """Canonical family of an aten op name, so that spellings and backend variants compare equal.

    Examples: addmm / mm / bmm -> "matmul"; convolution / mkldnn_convolution -> "conv";
    native_layer_norm -> "layer_norm"; _softmax -> "softmax"; relu_ -> "relu".
    """
    if name in _CANONICAL:
        return _CANONICAL[name]
    for prefix, family in _CANONICAL_PREFIXES:
        if name.startswith(prefix):
            return family
    if name.endswith("_") and not name.endswith("__"):
        name = name[:-1]
    return _CANONICAL.get(name, name)


@dataclass
class OpRecord:
    """One dispatched aten op: name (overload packet, e.g. "convolution"), flops, bytes (args + results)."""

    name: str
    flops: int
    bytes: int


@dataclass
class TraceResult:
    """Ops in dispatch order plus totals. `ops` excludes IGNORED_OPS; `total_bytes` counts every non-view op."""

    ops: list[OpRecord] = field(default_factory=list)
    total_flops: int = 0
    total_bytes: int = 0
    input_bytes: int = 0
    param_bytes: int = 0
    output_bytes: int = 0
    max_op_bytes: int = 0

    @property
    def op_names(self) -> tuple[str, ...]:
        """Raw aten names in dispatch order."""
        return tuple(r.name for r in self.ops)

    @property
    def signature(self) -> tuple[str, ...]:
        """The normalised operator sequence: canonical names (see `canonical_op`) in dispatch order."""
        return tuple(canonical_op(r.name) for r in self.ops)


def _tensor_bytes(x: Any) -> int:
    import torch

    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    if isinstance(x, (list, tuple)):
        return sum(_tensor_bytes(v) for v in x)
    return 0


def _make_tracer(result: TraceResult):
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.flop_counter import flop_registry

    class _Tracer(TorchDispatchMode):
        def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            if func.is_view:
                return out
            packet = func.overloadpacket
            name = packet.__name__
            nbytes = _tensor_bytes(list(args)) + _tensor_bytes(list(kwargs.values())) + _tensor_bytes(out)
            flops = 0
            f = flop_registry.get(packet)
            if f is not None:
                try:
                    flops = int(f(*args, **kwargs, out_val=out))
                except Exception:  # a formula that does not cover this overload: count no FLOPs
                    flops = 0
            result.total_bytes += nbytes
            result.total_flops += flops
            result.max_op_bytes = max(result.max_op_bytes, nbytes)
            bookkeeping = (  # e.g. BatchNorm's num_batches_tracked += 1
                func._schema.is_mutable and args and isinstance(args[0], torch.Tensor)
                and not args[0].is_floating_point()
            )
            if name not in IGNORED_OPS and not bookkeeping:
                result.ops.append(OpRecord(name, flops, nbytes))
            return out

    return _Tracer()


def trace_module(mod: types.ModuleType, device: str = "meta", seed: int = 0) -> TraceResult:
    """Build the reference from a loaded module on `device` and trace one forward.

    Raises whatever building or running the reference raises (e.g. NotImplementedError for an op without a
    meta kernel, or data-dependent code such as `.item()` on meta tensors).
    """
    import torch

    from tasks.reference import flatten_outputs

    result = TraceResult()
    with torch.device(device):
        torch.manual_seed(seed)
        model = mod.Model(*list(mod.get_init_inputs()))
        inputs = list(mod.get_inputs())
    result.param_bytes = sum(_tensor_bytes(p) for p in model.parameters()) + sum(
        _tensor_bytes(b) for b in model.buffers()
    )
    result.input_bytes = _tensor_bytes(inputs)
    with torch.no_grad(), _make_tracer(result):
        out = model(*inputs)
    result.output_bytes = _tensor_bytes(flatten_outputs(out))
    return result


def trace_source(source: str, origin: str = "<reference>", device: str = "meta") -> TraceResult:
    """`trace_module` on a source text (executes the source in this process)."""
    from tasks.reference import load_module

    return trace_module(load_module(source, origin), device=device)
