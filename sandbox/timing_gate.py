"""A timing gate for CUDA: the stream is held by a waiting kernel while a timed call is enqueued.

Without it, the start event of a timed call fires as soon as it is recorded, and the GPU then idles while the host
runs the call's Python (the dispatch guard, the launcher's checks, torch's dispatcher) and launches the kernels: the
event interval measures host time as much as GPU time, and host time on a shared host is noisy. With it (NVBench's
"blocking kernel", NVIDIA/nvbench, `blocking_kernel`): a one-thread kernel that spins on a word of host-mapped
pinned memory is launched first, the start event, the call's work and the end event queue up behind it, and the host
releases the gate once the call has returned; the events then bracket the GPU's own run of the call. Unlike
NVBench's one-thread kernel, the gate's blocks fill every SM's thread slots, so work the call puts on another stream
cannot run while the host is still enqueueing (work done off the clock); it runs after the release, where the host's
release-to-synchronised time counts it (sandbox.timing.Timer.run).

The gate gives up by itself after `timeout_ms` (the GPU's %globaltimer), so a call that synchronises the device
while the gate holds the stream (a `.item()`, a blocking copy) waits that long and no longer; the gate then marks
itself expired and the caller (sandbox.timing.Timer) falls back to the ungated figure for that call.

The gate kernel is built from GATE_SOURCE with the sandbox's nvcc for the device's architecture (trusted side,
`gate_cubin`, cached by content hash) and loaded in each process that times (`Gate`), before any solution code
exists in it.

Raises nothing at import; `gate_cubin` returns None where nvcc or a GPU is missing (no gate: ungated timing).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

GATE_SOURCE = r"""
// Block 0's first thread waits for the host's word `flag` to reach `want` (or for the timeout, which it records in
// `expired`), then publishes `want` in the device word `release`; every other block's first thread waits for
// `release`. The other threads wait at the barrier: the gate's blocks fill every SM's thread slots, so no kernel of
// any stream runs while the gate is held.
extern "C" __global__ void cuda_agent_timing_gate(const volatile unsigned int* flag, unsigned int want,
                                                  unsigned long long timeout_ns, volatile unsigned int* expired,
                                                  volatile unsigned int* release) {
    if (threadIdx.x == 0) {
        unsigned long long t0, t;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
        if (blockIdx.x == 0) {
            while ((int)(*flag - want) < 0) {
                asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
                if (t - t0 > timeout_ns) {
                    *expired = want;
                    __threadfence_system();
                    break;
                }
                __nanosleep(500);
            }
            *release = want;
            __threadfence();
        } else {
            while ((int)(*release - want) < 0) {
                asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
                if (t - t0 > timeout_ns + 1000000ull) break;  // block 0 never ran: give up 1 ms after it would have
                __nanosleep(500);
            }
        }
    }
    __syncthreads();
}
"""
GATE_KERNEL = "cuda_agent_timing_gate"

_CU_MEMHOSTALLOC_PORTABLE = 0x01
_CU_MEMHOSTALLOC_DEVICEMAP = 0x02
_cubins: dict[tuple[str, str, str], bytes | None] = {}


def gate_cubin(nvcc: str, arch: str, cache_dir: str) -> bytes | None:
    """The gate kernel built with `nvcc -cubin -arch=ARCH` (e.g. "sm_90a"), cached under cache_dir by a hash of
    the source, the arch and nvcc's version. Returns None when nvcc is missing or the build fails (callers then
    time without a gate)."""
    key = (nvcc, arch, cache_dir)
    if key in _cubins:
        return _cubins[key]
    out: bytes | None = None
    try:
        ver = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=30).stdout
        h = hashlib.sha256(f"{GATE_SOURCE}\0{arch}\0{ver}".encode()).hexdigest()[:24]
        path = Path(cache_dir) / "timing_gate" / f"{h}.cubin"
        if path.is_file():
            out = path.read_bytes()
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(prefix="gate-") as d:
                src = Path(d) / "gate.cu"
                src.write_text(GATE_SOURCE)
                r = subprocess.run([nvcc, "-cubin", f"-arch={arch}", "-O3", "-o", str(Path(d) / "gate.cubin"),
                                    str(src)], capture_output=True, text=True, timeout=120)
                if r.returncode == 0:
                    out = (Path(d) / "gate.cubin").read_bytes()
                    tmp = path.with_suffix(f".{os.getpid()}.tmp")
                    tmp.write_bytes(out)
                    os.replace(tmp, path)
    except (OSError, subprocess.TimeoutExpired):
        out = None
    _cubins[key] = out
    return out


class Gate:
    """The gate, loaded in this process's CUDA context of torch's current device.

    close(stream): launch the gate on `stream` (a CUstream handle, e.g. torch's `cuda_stream`); open(): release it;
    expired(): whether the last gate gave up by itself before open(). timeout_ms: how long a gate waits at most.
    Raises runtime.KernelLaunchError when the driver refuses the module, the memory or a launch.
    """

    def __init__(self, cubin: bytes, timeout_ms: float, device_index: int) -> None:
        from sandbox import runtime

        drv = runtime._get_driver()
        drv.primary_context(device_index)
        # a library object of the gate's own (the same libcuda), not the launcher's: what the gate configures and
        # calls (its own cuLaunchKernel among them) stays off the object a solution reaches (sandbox.runtime._driver),
        # whose launch call only a kernel's launch may make (sandbox.integrity.KERNEL_EVENT)
        lib = ctypes.CDLL("libcuda.so.1")
        launch = lib["cuLaunchKernel"]
        launch.argtypes = runtime.CU_LAUNCH_ARGTYPES
        lib.cuModuleLoadData.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p]
        lib.cuMemHostAlloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_uint]
        lib.cuMemHostGetDevicePointer_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_void_p, ctypes.c_uint]
        lib.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
        lib.cuMemsetD32_v2.argtypes = [ctypes.c_uint64, ctypes.c_uint, ctypes.c_size_t]
        lib.cuDeviceGet.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int]
        lib.cuDeviceGetAttribute.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.c_int]
        cu_dev = ctypes.c_int()
        drv.check(lib.cuDeviceGet(ctypes.byref(cu_dev), device_index), "cuDeviceGet")

        def attr(a: int) -> int:
            v = ctypes.c_int()
            drv.check(lib.cuDeviceGetAttribute(ctypes.byref(v), a, cu_dev), "cuDeviceGetAttribute")
            return v.value

        # blocks of the largest size, as many per SM as fill its thread slots (H200: 132 SMs x 2 x 1024 threads)
        self.threads = min(attr(1), 1024)  # MAX_THREADS_PER_BLOCK
        self.blocks = attr(16) * max(1, attr(39) // self.threads)  # MULTIPROCESSOR_COUNT x (MAX_THREADS_PER_SM / .)
        self._cubin = bytes(cubin)  # the module image must stay alive while loaded
        mod = ctypes.c_void_p()
        drv.check(lib.cuModuleLoadData(ctypes.byref(mod), self._cubin), "cuModuleLoadData (timing gate)")
        fn = ctypes.c_void_p()
        drv.check(lib.cuModuleGetFunction(ctypes.byref(fn), mod, GATE_KERNEL.encode()), "cuModuleGetFunction")
        host = ctypes.c_void_p()
        drv.check(lib.cuMemHostAlloc(ctypes.byref(host), 64, _CU_MEMHOSTALLOC_PORTABLE | _CU_MEMHOSTALLOC_DEVICEMAP),
                  "cuMemHostAlloc (timing gate)")
        dev = ctypes.c_uint64()
        drv.check(lib.cuMemHostGetDevicePointer_v2(ctypes.byref(dev), host, 0), "cuMemHostGetDevicePointer")
        rel = ctypes.c_uint64()
        drv.check(lib.cuMemAlloc_v2(ctypes.byref(rel), 4), "cuMemAlloc (timing gate)")
        drv.check(lib.cuMemsetD32_v2(rel.value, 0, 1), "cuMemsetD32 (timing gate)")
        self._flag = ctypes.c_uint32.from_address(host.value)
        self._expired = ctypes.c_uint32.from_address(host.value + 4)
        self._flag.value = 0
        self._expired.value = 0
        self._count = 0
        # the launch's argument values, reused per launch (cuLaunchKernel copies them at the call)
        self._a_flag = ctypes.c_uint64(dev.value)
        self._a_want = ctypes.c_uint32(0)
        self._a_timeout = ctypes.c_uint64(int(max(timeout_ms, 0.001) * 1e6))
        self._a_expired = ctypes.c_uint64(dev.value + 4)
        self._a_release = ctypes.c_uint64(rel.value)
        vals = [self._a_flag, self._a_want, self._a_timeout, self._a_expired, self._a_release]
        self._params = (ctypes.c_void_p * 5)(*[ctypes.cast(ctypes.byref(v), ctypes.c_void_p) for v in vals])
        self._drv, self._lib, self._fn, self._mod, self._launch = drv, lib, fn, mod, launch
        self.timeout_ms = float(timeout_ms)

    def close(self, stream: int) -> None:
        """Launch the gate on `stream`: work queued on it after this waits until open() (or the timeout)."""
        self._count += 1
        self._a_want.value = self._count & 0xFFFFFFFF
        self._drv.check(self._launch(self._fn, self.blocks, 1, 1, self.threads, 1, 1, 0, stream, self._params, None),
                        "launch of the timing gate")

    def open(self) -> None:
        """Release the gate launched last."""
        self._flag.value = self._count & 0xFFFFFFFF

    def expired(self) -> bool:
        """Whether the gate launched last gave up by itself (read after the device synchronised)."""
        return self._expired.value == (self._count & 0xFFFFFFFF)


def load_gate(cubin: Any, timeout_ms: float, device: str) -> Gate | None:
    """A Gate for `device` ("cuda:N") from cubin bytes, or None when there are none or the driver refuses them."""
    if not cubin or not device.startswith("cuda"):
        return None
    from sandbox.runtime import KernelLaunchError

    try:
        import torch

        return Gate(bytes(cubin), timeout_ms, torch.device(device).index or 0)
    except (OSError, AttributeError, KernelLaunchError):
        return None
