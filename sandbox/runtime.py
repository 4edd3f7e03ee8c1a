"""The launcher a solution's `model_new.py` imports to call its own kernels on torch tensors.

Usage in `model_new.py` (the full contract is in `sandbox/FORMATS.md`)::

    from sandbox.runtime import load_kernels
    K = load_kernels()                       # every extern "C" entry point of the built kernels/
    K.relu(x, out, n, grid=((n + 255) // 256,), block=(256,))   # cubin format, CUDA tensors
    K.relu(x, out, n)                                          # cpu format, CPU tensors

    from sandbox.runtime import load_extension                  # extension format (kernels/*_binding.cpp)
    ext = load_extension()
    ext.forward(x)

Each launcher checks its arguments against the entry point's C signature (parsed from the source by
`sandbox.signature`) before it launches: pointer parameters take contiguous torch tensors of the pointee's dtype
(`void*` takes any dtype) on the right device (CPU for the cpu format, torch's current CUDA device for cubin);
scalar parameters take Python numbers that fit the C type. A mismatch raises `LaunchArgumentError` naming the
kernel and the parameter.

cubin launches go through the CUDA driver API (`cuLaunchKernel`, via ctypes on libcuda) in torch's primary
context on torch's current stream (`torch.cuda.current_stream().cuda_stream`), so they order with torch's own
work and with the harness's CUDA events. PyCUDA is not used for the launch itself: it can only launch on streams it
created, not on a stream handle owned by torch. cpu launches are ctypes calls into the built shared library (ctypes
releases the GIL during the call; OpenMP inside the kernel is allowed).

Where the kernels come from: the sandbox builds them before `model_new.py` is imported and points
`$CUDA_AGENT_KERNELS_MANIFEST` at the build's manifest (JSON: format, artefact paths, parsed entry points).
Outside the sandbox (a person trying a solution by hand), `load_kernels(src_dir="kernels", fmt="cpu")` builds
`kernels/` on the spot with the same builder.

Each launch is counted in `launch_counts` (kernel name -> launches) so the harness can tell a decoy kernel that is
never launched; inside the sandbox the counts it believes are the monitor's (sandbox.integrity), and the foreign
functions the launches call (a cpu kernel's entry point, the driver's cuLaunchKernel) are kept by the monitor, which
lets only the launches themselves call them (`_guarded`): calling a raw entry point is `harness_tampering`.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import threading
from pathlib import Path
from typing import Any, Iterable

from sandbox.signature import SCALAR_TYPES, KernelSignature

MANIFEST_ENV = "CUDA_AGENT_KERNELS_MANIFEST"

launch_counts: dict[str, int] = {}
_lock = threading.Lock()


class LaunchArgumentError(TypeError):
    """A launcher was called with arguments that do not fit the kernel's C signature."""


class KernelLaunchError(RuntimeError):
    """The CUDA driver refused a launch (bad configuration, too much shared memory, ...)."""


_CTYPES_INT = {
    (8, True): ctypes.c_int8,
    (8, False): ctypes.c_uint8,
    (16, True): ctypes.c_int16,
    (32, True): ctypes.c_int32,
    (32, False): ctypes.c_uint32,
    (64, True): ctypes.c_int64,
    (64, False): ctypes.c_uint64,
}


def _scalar(sig: KernelSignature, idx: int, value: Any) -> Any:
    p = sig.params[idx]
    kind, bits, signed = SCALAR_TYPES[p.ctype]
    label = f"{sig.name}: argument {idx} ({p.ctype} {p.name})".rstrip()
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        raise LaunchArgumentError(f"{label} is a scalar parameter; pass a Python number, not a tensor")
    if kind == "bool":
        if not isinstance(value, (bool, int)):
            raise LaunchArgumentError(f"{label} expects bool, got {type(value).__name__}")
        return ctypes.c_bool(bool(value))
    if kind == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise LaunchArgumentError(f"{label} expects a number, got {type(value).__name__}")
        return (ctypes.c_float if bits == 32 else ctypes.c_double)(float(value))
    if isinstance(value, bool) or not isinstance(value, int):
        if hasattr(value, "__index__"):
            value = value.__index__()
        else:
            raise LaunchArgumentError(f"{label} expects an int, got {type(value).__name__}")
    lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    if not lo <= value <= hi:
        raise LaunchArgumentError(f"{label} = {value} does not fit in {p.ctype}")
    return _CTYPES_INT[(bits, signed)](value)


def _pointer(sig: KernelSignature, idx: int, value: Any, device: str) -> ctypes.c_void_p:
    import torch

    p = sig.params[idx]
    label = f"{sig.name}: argument {idx} ({'const ' if p.const else ''}{p.ctype}* {p.name})".rstrip()
    if value is None:
        return ctypes.c_void_p(0)
    if not isinstance(value, torch.Tensor):
        raise LaunchArgumentError(f"{label} expects a torch tensor, got {type(value).__name__}")
    if device == "cpu":
        if value.device.type != "cpu":
            raise LaunchArgumentError(f"{label}: tensor is on {value.device}, the cpu format needs CPU tensors")
    else:
        if value.device.type != "cuda" or value.device.index != torch.cuda.current_device():
            raise LaunchArgumentError(
                f"{label}: tensor is on {value.device}, the kernel runs on cuda:{torch.cuda.current_device()}"
            )
    if p.dtype != "any" and str(value.dtype) != f"torch.{p.dtype}":
        raise LaunchArgumentError(f"{label}: tensor dtype is {value.dtype}, the kernel expects torch.{p.dtype}")
    if not value.is_contiguous():
        raise LaunchArgumentError(f"{label}: tensor is not contiguous (call .contiguous() first)")
    return ctypes.c_void_p(value.data_ptr())


def _convert(sig: KernelSignature, args: tuple, device: str) -> list:
    """ctypes values of a launch's arguments, checked one by one (the reference path: `_Packer` answers the common
    cases faster and falls back to these checks, and their error messages, for everything else)."""
    if len(args) != len(sig.params):
        raise LaunchArgumentError(f"{sig.describe()} takes {len(sig.params)} arguments, got {len(args)}")
    return [
        _pointer(sig, i, a, device) if sig.params[i].pointer else _scalar(sig, i, a) for i, a in enumerate(args)
    ]


class _Packer:
    """The argument checks of one entry point, prepared once at load (per launch, no imports, no string formatting,
    no label building): `pack(args, device_index)` returns the values to launch with, or raises the exact
    LaunchArgumentError of `_convert` (whose checks it falls back to for any argument outside the fast cases).

    Fast cases (everything else takes `_pointer` / `_scalar`):
      pointer: an exact torch.Tensor or nn.Parameter (no subclass: its attribute reads could run solution code)
        on the format's device (cpu; or CUDA device `device_index`), of the pointee's dtype object (any for
        void*), contiguous;
      int scalar: an exact int within the C type's range; float scalar: an exact int or float; bool: bool or int.
    raw=True (cpu: the ctypes function has argtypes) gives plain ints / floats / bools, which ctypes converts in C;
    raw=False (cubin: cuLaunchKernel takes the arguments' addresses) gives ctypes objects, as `_convert` does.
    """

    def __init__(self, sig: KernelSignature, device: str, raw: bool):
        import torch

        self.sig = sig
        self.device = device
        self.n = len(sig.params)
        self.exact = (torch.Tensor, torch.nn.Parameter)
        self.cuda = device != "cpu"
        self.raw = raw
        specs = []
        for p in sig.params:
            if p.pointer:
                specs.append(("ptr", getattr(torch, p.dtype) if p.dtype != "any" else None, None, 0, 0))
            else:
                kind, bits, signed = SCALAR_TYPES[p.ctype]
                if kind == "bool":
                    specs.append(("bool", None, ctypes.c_bool, 0, 0))
                elif kind == "float":
                    specs.append(("float", None, ctypes.c_float if bits == 32 else ctypes.c_double, 0, 0))
                else:
                    lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
                    specs.append(("int", None, _CTYPES_INT[(bits, signed)], lo, hi))
        self.specs = tuple(specs)

    def argtypes(self) -> list:
        """The ctypes argtypes of the entry point (raw mode): c_void_p for pointers, the C type for scalars."""
        return [ctypes.c_void_p if k == "ptr" else ct for k, _, ct, _, _ in self.specs]

    def pack(self, args: tuple, device_index: int = -1) -> list:
        """Checked launch values of args (see the class doc); device_index: torch's current CUDA device (cubin)."""
        if len(args) != self.n:
            raise LaunchArgumentError(f"{self.sig.describe()} takes {self.n} arguments, got {len(args)}")
        out = []
        exact, raw, cuda = self.exact, self.raw, self.cuda
        for i, (spec, v) in enumerate(zip(self.specs, args)):
            kind, dt, ct, lo, hi = spec
            t = type(v)
            if kind == "ptr":
                if t in exact and (v.is_cuda and v.get_device() == device_index if cuda else v.is_cpu) \
                        and (dt is None or v.dtype is dt) and v.is_contiguous():
                    out.append(v.data_ptr() if raw else ctypes.c_void_p(v.data_ptr()))
                else:
                    out.append(_pointer(self.sig, i, v, self.device))
            elif kind == "int" and t is int and lo <= v <= hi:
                out.append(v if raw else ct(v))
            elif kind == "float" and (t is float or t is int):
                out.append(float(v) if raw else ct(float(v)))
            elif kind == "bool" and (t is bool or t is int):
                out.append(bool(v) if raw else ct(bool(v)))
            else:
                out.append(_scalar(self.sig, i, v))
        return out


def _count(name: str, stream: int = 0) -> None:
    """Count one launch of kernel `name` (cubin: on the CUstream handle `stream`): here (for logs), and, through the
    audit event "cuda_agent.launch", in the sandbox's monitor when one is installed, whose counts are the ones the
    harness believes (sandbox.integrity: it takes the event only from this function called by a kernel's own
    launch). Launches per stream handle are counted too (`launch_streams`): the timing gate counts a call whose
    kernels went to another stream than the one it holds in full (sandbox.timing.Timer.side_work)."""
    with _lock:
        launch_counts[name] = launch_counts.get(name, 0) + 1
        launch_streams[stream] = launch_streams.get(stream, 0) + 1
    _audit("cuda_agent.launch", name, stream)


launch_streams: dict[int, int] = {}


_audit = sys.audit
KERNEL_EVENT = "cuda_agent.kernel"  # sandbox.integrity.KERNEL_EVENT


def _guarded(fn: Any, name: str) -> Any:
    """fn as the sandbox's monitor hands it back when one is installed: a wrapper that only a launch (which counts
    itself) may call, the foreign function itself kept where no object of the solution's process leads to it
    (sandbox.integrity.Monitor._take_kernel); fn itself without a monitor."""
    box: list = []
    _audit(KERNEL_EVENT, fn, name, box)
    return box[0] if box else fn


def _dims(label: str, what: str, v: Any) -> tuple[int, int, int]:
    if isinstance(v, int):
        v = (v,)
    try:
        t = tuple(int(x) for x in v)
    except TypeError:
        raise LaunchArgumentError(f"{label}: {what} must be an int or a tuple of 1-3 ints, got {v!r}") from None
    if not 1 <= len(t) <= 3 or any(x < 1 for x in t):
        raise LaunchArgumentError(f"{label}: {what} must be 1-3 positive ints, got {v!r}")
    return t + (1,) * (3 - len(t))  # type: ignore[return-value]


class CpuKernel:
    """A host entry point in a shared library: `kernel(*args)` runs it synchronously on the calling thread."""

    def __init__(self, sig: KernelSignature, lib: ctypes.CDLL):
        self.signature = sig
        self._pack = _Packer(sig, "cpu", raw=True)
        fn = lib[sig.name]  # (not getattr: that keeps the function on the library object too)
        fn.restype = None
        fn.argtypes = self._pack.argtypes()  # ctypes converts the packed ints / floats itself (in C)
        self._fn = _guarded(fn, sig.name)

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        if kwargs:
            raise LaunchArgumentError(
                f"{self.signature.name}: the cpu format takes no keyword arguments (got {sorted(kwargs)}); "
                "grid/block are for cubin kernels"
            )
        vals = self._pack.pack(args)
        _count(self.signature.name)
        self._fn(*vals)


# cuLaunchKernel(f, grid x3, block x3, shared_mem, stream, kernelParams, extra)
CU_LAUNCH_ARGTYPES = [ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint,
                      ctypes.c_uint, ctypes.c_uint, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p]


class _Driver:
    """The few CUDA driver API calls the cubin launcher needs, through ctypes on libcuda."""

    def __init__(self) -> None:
        self.lib = ctypes.CDLL("libcuda.so.1")
        self.lib.cuGetErrorName.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        launch = self.lib["cuLaunchKernel"]  # kept by the monitor (_guarded), not on the library object
        launch.argtypes = CU_LAUNCH_ARGTYPES
        self.launch = _guarded(launch, "cuLaunchKernel")
        self.lib.cuModuleLoad.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p]
        self.lib.cuModuleGetFunction.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p, ctypes.c_char_p]
        self.lib.cuDevicePrimaryCtxRetain.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int]
        self.lib.cuCtxGetCurrent.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
        self.lib.cuCtxSetCurrent.argtypes = [ctypes.c_void_p]
        self.lib.cuFuncSetAttribute.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
        self.check(self.lib.cuInit(0), "cuInit")
        self._ctx: dict[int, int] = {}

    def check(self, rc: int, what: str) -> None:
        if rc != 0:
            name = ctypes.c_char_p()
            self.lib.cuGetErrorName(rc, ctypes.byref(name))
            raise KernelLaunchError(f"{what} failed: {(name.value or b'?').decode()} ({rc})")

    def primary_context(self, device: int) -> int:
        """Make torch's primary context of `device` current on this thread; return its handle."""
        ctx = self._ctx.get(device)
        if ctx is None:
            h = ctypes.c_void_p()
            self.check(self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(h), device), "cuDevicePrimaryCtxRetain")
            ctx = self._ctx[device] = h.value or 0
        cur = ctypes.c_void_p()
        self.check(self.lib.cuCtxGetCurrent(ctypes.byref(cur)), "cuCtxGetCurrent")
        if (cur.value or 0) != ctx:
            self.check(self.lib.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        return ctx


_driver: _Driver | None = None


def _get_driver() -> _Driver:
    global _driver
    if _driver is None:
        import torch

        torch.cuda.init()  # torch creates / retains the primary context first
        _driver = _Driver()
    return _driver


class CubinKernel:
    """A `__global__` entry point of a cubin: `kernel(*args, grid=..., block=..., shared_mem=0)`.

    Launches asynchronously on torch's current stream of torch's current device (as any torch op does).
    Raises LaunchArgumentError for bad arguments, KernelLaunchError when the driver refuses the launch.
    """

    def __init__(self, sig: KernelSignature, cubin_path: str):
        import torch

        self.signature = sig
        self._pack = _Packer(sig, "cuda", raw=False)
        self._cuda = torch.cuda  # bound at load: no import per launch
        self._path = cubin_path
        self._funcs: dict[int, int] = {}
        self._modules: dict[int, int] = {}

    def _function(self, drv: _Driver, device: int) -> int:
        f = self._funcs.get(device)
        if f is None:
            mod = _module_cache.get((self._path, device))
            if mod is None:
                h = ctypes.c_void_p()
                drv.check(drv.lib.cuModuleLoad(ctypes.byref(h), self._path.encode()), f"cuModuleLoad({Path(self._path).name})")
                mod = _module_cache[(self._path, device)] = h.value or 0
            fh = ctypes.c_void_p()
            drv.check(drv.lib.cuModuleGetFunction(ctypes.byref(fh), mod, self.signature.name.encode()),
                      f"cuModuleGetFunction({self.signature.name})")
            f = self._funcs[device] = fh.value or 0
        return f

    def __call__(self, *args: Any, grid: Any = None, block: Any = None, shared_mem: int = 0, **kwargs: Any) -> None:
        cuda = self._cuda
        name = self.signature.name
        if kwargs:
            raise LaunchArgumentError(f"{name}: unknown keyword argument(s) {sorted(kwargs)} (grid, block, shared_mem)")
        if grid is None or block is None:
            raise LaunchArgumentError(f"{name}: a cubin launch needs grid=... and block=...")
        g, b = _dims(name, "grid", grid), _dims(name, "block", block)
        if b[0] * b[1] * b[2] > 1024:
            raise LaunchArgumentError(f"{name}: block {b} has more than 1024 threads")
        if not isinstance(shared_mem, int) or shared_mem < 0:
            raise LaunchArgumentError(f"{name}: shared_mem must be a non-negative int (bytes)")
        device = cuda.current_device()
        vals = self._pack.pack(args, device)
        drv = _get_driver()
        drv.primary_context(device)
        f = self._function(drv, device)
        if shared_mem > 48 * 1024:
            drv.check(drv.lib.cuFuncSetAttribute(f, 8, shared_mem), f"{name}: set max dynamic shared memory")
        params = _kernel_params(vals)
        stream = cuda.current_stream(device).cuda_stream
        _count(name, stream)
        drv.check(drv.launch(f, g[0], g[1], g[2], b[0], b[1], b[2], shared_mem, stream, params, None),
                  f"launch of {name} grid={g} block={b} shared_mem={shared_mem}")


_module_cache: dict[tuple[str, int], int] = {}


def _kernel_params(vals: list) -> Any:
    """cuLaunchKernel's `void** kernelParams`: one pointer to each argument's value (vals must outlive the launch)."""
    return (ctypes.c_void_p * max(1, len(vals)))(*[ctypes.addressof(v) for v in vals])


class Kernels:
    """The entry points of a build, as attributes (`K.relu(...)`); `K.names` lists them."""

    def __init__(self, kernels: dict[str, Any], fmt: str):
        self._kernels = kernels
        self.format = fmt

    @property
    def names(self) -> list[str]:
        return sorted(self._kernels)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return self._kernels[name]
        except KeyError:
            raise AttributeError(
                f"no kernel named {name!r} in the build (entry points: {', '.join(self.names) or 'none'}); "
                'entry points need extern "C" (and __global__ for .cu files)'
            ) from None

    def __dir__(self) -> Iterable[str]:
        return list(super().__dir__()) + self.names


def read_manifest(path: str | os.PathLike | None = None) -> dict[str, Any]:
    """The build manifest at `path` or `$CUDA_AGENT_KERNELS_MANIFEST`. Raises FileNotFoundError when neither is set."""
    p = path or os.environ.get(MANIFEST_ENV)
    if not p:
        raise FileNotFoundError(f"no kernel build: ${MANIFEST_ENV} is not set and no manifest was given")
    return json.loads(Path(p).read_text())


def load_kernels(manifest: str | os.PathLike | None = None, *, src_dir: str | os.PathLike | None = None,
                 fmt: str | None = None) -> Kernels:
    """Load every entry point of the solution's built kernels.

    Args:
      manifest: build manifest path; default `$CUDA_AGENT_KERNELS_MANIFEST` (set by the sandbox).
      src_dir, fmt: outside the sandbox only: build `src_dir` (e.g. "kernels") in format `fmt` ("cpu" | "cubin")
        on the spot, with the sandbox's builder and cache.
    Returns: a `Kernels` object with one launcher per entry point.
    Raises: FileNotFoundError (no build), LaunchArgumentError/KernelLaunchError later, at call time.
    """
    if manifest is None and not os.environ.get(MANIFEST_ENV) and src_dir is not None:
        from sandbox.build import build_dir_for_dev

        manifest = build_dir_for_dev(Path(src_dir), fmt or "cpu")
    m = read_manifest(manifest)
    kernels: dict[str, Any] = {}
    for art in m["artifacts"]:
        sigs = [KernelSignature.from_dict(s) for s in art["entry_points"]]
        if art["kind"] == "so":
            lib = ctypes.CDLL(art["path"], mode=os.RTLD_LOCAL | os.RTLD_NOW)
            for s in sigs:
                kernels[s.name] = CpuKernel(s, lib)
        elif art["kind"] == "cubin":
            for s in sigs:
                kernels[s.name] = CubinKernel(s, art["path"])
    return Kernels(kernels, m["format"])


def load_extension(manifest: str | os.PathLike | None = None) -> Any:
    """The Python module built from `kernels/*.cu` + `kernels/*_binding.cpp` (extension format).

    Raises FileNotFoundError when there is no extension build in the manifest.
    """
    import importlib.machinery
    import importlib.util

    import torch  # noqa: F401  (the extension links against libtorch, which must be loaded first)

    m = read_manifest(manifest)
    for art in m["artifacts"]:
        if art["kind"] == "ext":
            loader = importlib.machinery.ExtensionFileLoader(art["module_name"], art["path"])
            spec = importlib.util.spec_from_file_location(art["module_name"], art["path"], loader=loader)
            assert spec is not None
            mod = importlib.util.module_from_spec(spec)
            loader.exec_module(mod)
            return mod
    raise FileNotFoundError("the build has no extension module (is this an extension-format solution?)")


# ------------------------------------------------------------------------------------------------ shape helpers
# Pure Python on shapes (no tensor op reaches torch's dispatcher): what a kernel needs to index its operands.


def bcast(p: Any, x: Any, axis: int | None = None) -> tuple[int, int]:
    """(count, inner) such that element i of the contiguous tensor x reads p's flat element (i // inner) % count
    when p is broadcast over x: the `p_count, p_inner` kernel arguments that `AT(p, i)` of `cuda_agent.h` reads.

    axis None: torch broadcasting (p's shape aligned to the right of x's); the axes where p's size is not 1 must be
    consecutive. An int: p is a vector running along that axis of x (as nn.PReLU's weight along axis 1).
    A single-element p gives (1, 1). Raises ValueError when p does not broadcast over x that way.
    """
    shape = [int(s) for s in x.shape]
    if p.numel() == 1:
        return 1, 1
    if axis is not None:
        a = axis if axis >= 0 else len(shape) + axis
        if not 0 <= a < len(shape) or p.numel() != shape[a]:
            raise ValueError(f"bcast: {p.numel()} parameter elements along axis {axis} of x of shape {tuple(shape)}")
        lo = hi = a
    else:
        ps = [int(s) for s in p.shape]
        off = len(shape) - len(ps)
        if off < 0 or any(s != 1 and s != shape[off + k] for k, s in enumerate(ps)):
            raise ValueError(f"bcast: parameter of shape {tuple(ps)} does not broadcast over {tuple(shape)}")
        big = [off + k for k, s in enumerate(ps) if s != 1]
        lo, hi = big[0], big[-1]
        if any(ps[a - off] == 1 and shape[a] != 1 for a in range(lo, hi + 1)):
            raise ValueError(f"bcast: parameter of shape {tuple(ps)} over {tuple(shape)}: its axes are not consecutive")
    count = inner = 1
    for s in shape[lo:hi + 1]:
        count *= s
    for s in shape[hi + 1:]:
        inner *= s
    return count, inner


def row_geometry(shape: Any, dim: int | tuple = -1, keepdim: bool = False,
                 reduce: bool = True) -> tuple[int, int, int, list[int]]:
    """(outer, cols, inner, out_shape) of a row operation over `dim` of a contiguous tensor of `shape`: row r
    (0 <= r < outer * inner) holds the `cols` elements base + c * inner, base = (r // inner) * cols * inner + r %
    inner, and a reduction writes its value at flat index r of out_shape.

    dim: one axis (negative counts from the end), or a tuple of trailing axes given by their first and last, e.g.
    (2, 3) or (2, -1) for the axes 2.. of a 4-D tensor (their product is cols, inner 1). keepdim: the reduced axes
    stay as size 1. reduce False (a normalisation): out_shape is shape.
    Raises ValueError for axes out of range or a tuple that does not end at the last axis.
    """
    shape = [int(s) for s in shape]
    nd = len(shape)
    dims = [d if d >= 0 else nd + d for d in (dim if isinstance(dim, (tuple, list)) else (dim,))]
    if not dims or any(not 0 <= d < nd for d in dims):
        raise ValueError(f"row_geometry: dim {dim} out of range for {nd} axes")
    if len(dims) > 1 and (dims[-1] != nd - 1 or dims != sorted(set(dims))
                          or (len(dims) > 2 and dims != list(range(dims[0], nd)))):
        raise ValueError(f"row_geometry: dims {dim} are not the trailing axes of {nd} (first and last, or all)")
    k0, k1 = dims[0], dims[-1]
    outer = cols = inner = 1
    for s in shape[:k0]:
        outer *= s
    for s in shape[k0:k1 + 1]:
        cols *= s
    for s in shape[k1 + 1:]:
        inner *= s
    if not reduce:
        return outer, cols, inner, shape
    out = shape[:k0] + ([1] * (k1 + 1 - k0) if keepdim else []) + shape[k1 + 1:]
    return outer, cols, inner, out
