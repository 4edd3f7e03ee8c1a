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

Each gate waits for a value of its own, drawn at random per launch (`want`, from os.urandom), and compares for
equality: the gate's words are within reach of the solution's kernels (a kernel can write any address of the
context, and a solution that found the device word `release` could otherwise set it ahead of the next gate, whose
blocks but the first would then not wait, leaving all SMs but one free for its side streams while the host
enqueues), but a value the next gate waits for is not known to anything but the host until that gate is released.
The gate resolves its driver functions from a libcuda handle of its own, not from sandbox.runtime's (which solution
code can reach): the memory calls it needs (cuMemAlloc, cuMemsetD32, cuMemHostAlloc, ...) are not made callable
through the launcher's handle without the monitor's symbol lookup rule seeing them.

What the gate does not hold: the copy engines. A copy on another stream (device to host into pinned memory, and
device to device where the driver uses a copy engine for it) runs while the host enqueues, off the clock. A
solution could so read its inputs into L2 after the flush, and its kernels would then read them from L2 on the
clock. So the gate can flush L2 itself (SandboxConfig.timing_gate_flush, on by default), after its
release (`close(stream, flush_ptr, flush_bytes)`, the Timer's L2 flush buffer): its blocks, which still fill every
SM, write zeros over the buffer before they exit. Whatever a copy engine brought into L2 while the gate held the
stream is evicted before the start event, and no kernel of another stream runs beside the flush until the gate's
blocks start to exit. What a copy still does while held is move bytes: it computes nothing (a strided copy can
gather, which stays open), and a copy that runs on past the flush runs beside the timed call, on its clock. The
flush's time is part of the gate's latency (sandbox.timing.Timer._gate_latency), not of the call.

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
// Block 0's first thread waits for the host's word `flag` to equal `want` (a value drawn at random per launch; or
// for the timeout, which it records in `expired`), then publishes `want` in the device word `release`; every other
// block's first thread waits for `release` to equal `want`. The other threads wait at the barrier: the gate's blocks
// fill every SM's thread slots, so no kernel of any stream runs while the gate is held. Equality, not order: a value
// written ahead into `release` or `flag` by anything but this launch's host (a solution's kernel) never matches.
// After the release, the blocks zero `flush` (flush_vecs 16-byte words; none when 0) before they exit: an L2 flush
// by blocks that still fill every SM, after anything a copy engine read into L2 while the gate held the stream.
extern "C" __global__ void cuda_agent_timing_gate(const volatile unsigned int* flag, unsigned int want,
                                                  unsigned long long timeout_ns, volatile unsigned int* expired,
                                                  volatile unsigned int* release, uint4* flush,
                                                  unsigned long long flush_vecs) {
    if (threadIdx.x == 0) {
        unsigned long long t0, t;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
        if (blockIdx.x == 0) {
            while (*flag != want) {
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
            while (*release != want) {
                asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
                if (t - t0 > timeout_ns + 1000000ull) break;  // block 0 never ran: give up 1 ms after it would have
                __nanosleep(500);
            }
        }
    }
    __syncthreads();
    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < flush_vecs; i += stride)
        flush[i] = zero;
}
"""
GATE_KERNEL = "cuda_agent_timing_gate"
# at most 32 registers a thread, so that 2 blocks of 1024 threads fit an SM (its 65,536 registers): the gate must
# fill every SM's thread slots (Gate checks the occupancy and refuses a gate that cannot)
GATE_NVCC_FLAGS = ("-O3", "-maxrregcount=32")

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
        h = hashlib.sha256(f"{GATE_SOURCE}\0{arch}\0{ver}\0{' '.join(GATE_NVCC_FLAGS)}".encode()).hexdigest()[:24]
        path = Path(cache_dir) / "timing_gate" / f"{h}.cubin"
        if path.is_file():
            out = path.read_bytes()
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(prefix="gate-") as d:
                src = Path(d) / "gate.cu"
                src.write_text(GATE_SOURCE)
                r = subprocess.run([nvcc, "-cubin", f"-arch={arch}", *GATE_NVCC_FLAGS, "-o",
                                    str(Path(d) / "gate.cubin"), str(src)], capture_output=True, text=True, timeout=120)
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
    """The gate, loaded in this process's CUDA context of device `device_index` (torch's primary context).

    close(stream, flush_ptr, flush_bytes): launch the gate on `stream` (a CUstream handle of that device, e.g.
    torch's `cuda_stream`), flushing L2 through the buffer after its release;
    open(): release it; expired(): whether the last gate gave up by itself before open(). timeout_ms: how long a
    gate waits at most. `device`: the device index. The thread's current context is left as it was.
    Raises runtime.KernelLaunchError when the driver refuses the module, the memory or a launch, or when the gate's
    blocks cannot fill an SM (its occupancy is below the SM's thread slots: side streams could run beside it).
    """

    def __init__(self, cubin: bytes, timeout_ms: float, device_index: int) -> None:
        from sandbox import runtime

        drv = runtime._get_driver()
        # a handle of our own: ctypes caches each looked-up function on its CDLL object, and sandbox.runtime's handle
        # is within the solution's reach (the monitor rules symbol lookups, not calls through cached functions); its
        # own cuLaunchKernel too, since the launcher's launch call only a kernel's launch may make
        # (sandbox.integrity.KERNEL_EVENT)
        lib = ctypes.CDLL("libcuda.so.1")
        launch = lib["cuLaunchKernel"]
        launch.argtypes = runtime.CU_LAUNCH_ARGTYPES
        lib.cuCtxGetCurrent.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
        lib.cuCtxSetCurrent.argtypes = [ctypes.c_void_p]
        lib.cuModuleLoadData.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p]
        lib.cuModuleGetFunction.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p, ctypes.c_char_p]
        lib.cuMemHostAlloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_uint]
        lib.cuMemHostGetDevicePointer_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_void_p, ctypes.c_uint]
        lib.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
        lib.cuMemsetD32_v2.argtypes = [ctypes.c_uint64, ctypes.c_uint, ctypes.c_size_t]
        lib.cuDeviceGet.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int]
        lib.cuDeviceGetAttribute.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.c_int]
        lib.cuOccupancyMaxActiveBlocksPerMultiprocessor.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_void_p,
                                                                     ctypes.c_int, ctypes.c_size_t]
        prev = ctypes.c_void_p()
        drv.check(lib.cuCtxGetCurrent(ctypes.byref(prev)), "cuCtxGetCurrent")
        ctx = drv.primary_context(device_index)
        self._launch = launch
        try:
            self._setup(drv, lib, cubin, timeout_ms, device_index)
        finally:
            if prev.value and prev.value != ctx:  # another device's context was current: it stays current
                lib.cuCtxSetCurrent(prev.value)

    def _setup(self, drv: Any, lib: Any, cubin: bytes, timeout_ms: float, device_index: int) -> None:
        cu_dev = ctypes.c_int()
        drv.check(lib.cuDeviceGet(ctypes.byref(cu_dev), device_index), "cuDeviceGet")

        def attr(a: int) -> int:
            v = ctypes.c_int()
            drv.check(lib.cuDeviceGetAttribute(ctypes.byref(v), a, cu_dev), "cuDeviceGetAttribute")
            return v.value

        # blocks of the largest size that divides an SM's thread slots, as many per SM as fill them (H200: 132 SMs x 2
        # x 1024 threads; an SM of 1536 slots: 2 x 768)
        slots = attr(39)  # MAX_THREADS_PER_MULTIPROCESSOR
        self.threads = next((t for t in range(min(attr(1), 1024), 31, -32) if slots % t == 0), 32)
        per_sm = max(1, slots // self.threads)
        self.blocks = attr(16) * per_sm  # MULTIPROCESSOR_COUNT x per_sm
        self._cubin = bytes(cubin)  # the module image must stay alive while loaded
        mod = ctypes.c_void_p()
        drv.check(lib.cuModuleLoadData(ctypes.byref(mod), self._cubin), "cuModuleLoadData (timing gate)")
        fn = ctypes.c_void_p()
        drv.check(lib.cuModuleGetFunction(ctypes.byref(fn), mod, GATE_KERNEL.encode()), "cuModuleGetFunction")
        # every SM's thread slots taken, or a kernel of another stream could run beside the gate (registers, were
        # the gate ever built to use more than 32 per thread, would allow fewer of its blocks per SM)
        occ = ctypes.c_int()
        drv.check(lib.cuOccupancyMaxActiveBlocksPerMultiprocessor(ctypes.byref(occ), fn, self.threads, 0),
                  "cuOccupancyMaxActiveBlocksPerMultiprocessor (timing gate)")
        if occ.value < per_sm or per_sm * self.threads < slots:
            from sandbox.runtime import KernelLaunchError

            raise KernelLaunchError(f"the timing gate cannot fill an SM ({occ.value} resident blocks of "
                                    f"{self.threads} threads per SM, {slots} thread slots): not used")
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
        self._want = 0
        self._rand = os.urandom  # bound now: a later replacement of os.urandom does not reach the gate
        # the launch's argument values, reused per launch (cuLaunchKernel copies them at the call)
        self._a_flag = ctypes.c_uint64(dev.value)
        self._a_want = ctypes.c_uint32(0)
        self._a_timeout = ctypes.c_uint64(int(max(timeout_ms, 0.001) * 1e6))
        self._a_expired = ctypes.c_uint64(dev.value + 4)
        self._a_release = ctypes.c_uint64(rel.value)
        self._a_flush = ctypes.c_uint64(0)
        self._a_flush_vecs = ctypes.c_uint64(0)
        vals = [self._a_flag, self._a_want, self._a_timeout, self._a_expired, self._a_release, self._a_flush,
                self._a_flush_vecs]
        self._params = (ctypes.c_void_p * len(vals))(*[ctypes.cast(ctypes.byref(v), ctypes.c_void_p) for v in vals])
        # the items' addresses, put back before every launch: an item re-pointed in place (the array object is the
        # same, so the identity snapshot would not see it) cannot make the gate wait on, or flush, another word
        self._param_addrs = tuple(self._params)
        # and the values that stay the same from launch to launch (the flag and expiry words' device addresses, the
        # timeout, the release word), put back too: a value changed in place is the same ctypes object
        self._fixed = (self._a_flag.value, self._a_timeout.value, self._a_expired.value, self._a_release.value)
        self._drv, self._lib, self._fn, self._mod = drv, lib, fn, mod
        self.device = int(device_index)
        self.timeout_ms = float(timeout_ms)

    def _next_want(self) -> int:
        """A value for the next gate to wait for: random, and unlike the words' current values (the last gate's)."""
        while True:
            w = int.from_bytes(self._rand(4), "little")
            if w != self._want and w != self._flag.value and w != self._expired.value:
                return w

    def close(self, stream: int, flush_ptr: int = 0, flush_bytes: int = 0) -> None:
        """Launch the gate on `stream`: work queued on it after this waits until open() (or the timeout). flush_ptr,
        flush_bytes: a device buffer of this device (16-byte aligned) that the gate zeroes after its release, in
        whole 16-byte words (an L2 flush after the hold; 0: none)."""
        self._want = self._next_want()
        self._params[:] = self._param_addrs
        self._a_flag.value, self._a_timeout.value, self._a_expired.value, self._a_release.value = self._fixed
        self._a_want.value = self._want
        self._a_flush.value = int(flush_ptr) if flush_bytes > 0 else 0
        self._a_flush_vecs.value = max(int(flush_bytes), 0) // 16 if flush_ptr else 0
        self._drv.check(self._launch(self._fn, self.blocks, 1, 1, self.threads, 1, 1, 0, stream, self._params, None),
                        "launch of the timing gate")

    def open(self) -> None:
        """Release the gate launched last."""
        self._flag.value = self._want

    def expired(self) -> bool:
        """Whether the gate launched last gave up by itself (read after the device synchronised)."""
        return self._expired.value == self._want


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
