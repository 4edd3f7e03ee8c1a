"""The dispatch-level guard around `ModelNew.forward`: only allocation, view, metadata and same-dtype copy ops.

`ComputeGuard` is a `TorchDispatchMode`: every ATen op that reaches torch's dispatcher while it is active (from
Python or from C++ extension code) passes through `__torch_dispatch__`. Ops outside `ALLOWED_OPS` are recorded
as violations and raise `ForbiddenOpError` naming the op; the record survives even if the candidate swallows
the exception. Kernel launches of our own launcher (ctypes / the CUDA driver) do not go through the dispatcher,
so a solution's own kernels are never in the way.

With `poison=True` (verification), memory returned by `empty`-style allocations is filled with NaN (floating
dtypes) or a sentinel (integer dtypes) before the solution sees it, so elements a kernel never writes show up
in the comparison instead of silently holding a previous result.

`fresh` collects the storage addresses of tensors that allocation and copy ops made while the guard was active:
the candidate worker requires every output of forward to live in such storage, so an output cached from an earlier
call, built at import time, or wrapped around memory torch did not allocate (`torch.from_numpy`) is caught.
"""

from __future__ import annotations

import types
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from sandbox.timing import raw_stream_reader

POISON_ALLOC = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"})

ALLOC_OPS = POISON_ALLOC | frozenset({
    "zeros", "zeros_like", "new_zeros", "ones", "ones_like", "new_ones", "full", "full_like", "new_full",
    "zero_", "fill_", "scalar_tensor", "resize_",
})
VIEW_OPS = frozenset({
    "view", "_unsafe_view", "reshape", "_reshape_alias", "as_strided", "alias", "detach", "detach_", "t", "transpose",
    "permute", "expand", "expand_as", "squeeze", "unsqueeze", "slice", "select", "narrow", "split",
    "split_with_sizes", "chunk", "unbind", "flatten", "unflatten", "view_as", "movedim", "unfold", "diagonal",
    "lift_fresh", "lift_fresh_copy", "contiguous", "view_as_real", "view_as_complex", "_conj", "conj",
    "resolve_conj", "resolve_neg", "_neg_view",
})
META_OPS = frozenset({
    "size", "stride", "sym_size", "sym_stride", "sym_numel", "numel", "dim", "is_contiguous", "storage_offset",
    "sym_storage_offset", "is_same_size", "_local_scalar_dense", "is_nonzero", "_has_compatible_shallow_copy_type",
    "record_stream", "set_",
})
COPY_OPS = frozenset({"clone", "copy_", "_to_copy", "_copy_from", "_copy_from_and_resize"})
ALLOWED_OPS = ALLOC_OPS | VIEW_OPS | META_OPS | COPY_OPS
# ops whose result is new memory: an output of forward must live in storage one of these made during the call
FRESH_OPS = POISON_ALLOC | frozenset({"zeros", "zeros_like", "new_zeros", "ones", "ones_like", "new_ones", "full",
                                      "full_like", "new_full", "scalar_tensor", "clone", "_to_copy", "lift_fresh_copy"})

_INT_SENTINEL = {
    torch.int8: -77, torch.uint8: 0xA5, torch.int16: -31337, torch.int32: -123456789, torch.int64: -1234567890123,
}


class ForbiddenOpError(RuntimeError):
    """A torch compute op was called inside ModelNew.forward."""


def poison_(t: torch.Tensor) -> None:
    """Fill t with NaN (floating, complex) or a sentinel (integer); bool tensors are left alone."""
    if t.is_floating_point() or t.is_complex():
        t.fill_(float("nan"))
    elif t.dtype in _INT_SENTINEL:
        t.fill_(_INT_SENTINEL[t.dtype])


class ComputeGuard(TorchDispatchMode):
    """Use as `with ComputeGuard(poison=True) as g: out = model(*inputs)`; then read `g.violations`.

    The op tables are frozensets (solution code cannot add to them); the candidate worker also checks that none
    of them was rebound (sandbox.integrity.HarnessSnapshot) and passes its own captured copies (`tables`).
    """

    def __init__(self, poison: bool = False, tables: tuple[frozenset, frozenset, frozenset] | None = None,
                 held: int | None = None, current: Any = None):
        """held: the CUstream handle a gated timed call holds (sandbox.timing_gate), or None: ops dispatched while
        another stream is torch's current one (`current()`, a function returning the current stream's handle, int;
        default sandbox.timing.raw_stream_reader(), which runs no Python code a solution could rebind: code run here
        runs with this guard off) are counted in `side_ops` (their work would run beside the gate)."""
        super().__init__()
        self.poison = poison
        self._held = held
        self._current = (current or raw_stream_reader()) if held is not None else None
        self.side_ops = 0
        self._allowed, self._fresh, self._poison_alloc = tables or (ALLOWED_OPS, FRESH_OPS, POISON_ALLOC)
        self._poison_fn = poison_
        # torch looks __torch_dispatch__ up on the mode object, so an instance attribute wins over the class's: the
        # guard dispatches through the function captured when this module was imported (before any solution code),
        # whatever is later assigned to ComputeGuard.__torch_dispatch__, even for the duration of one call.
        self.__torch_dispatch__ = types.MethodType(_DISPATCH, self)
        self.violations: list[str] = []
        self.ops_seen: dict[str, int] = {}
        self.fresh: set[int] = set()  # storage addresses allocated by FRESH_OPS during this guard

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: D105
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        qual = f"{func.namespace}::{name}"
        self.ops_seen[qual] = self.ops_seen.get(qual, 0) + 1
        if self._held is not None and self._current() != self._held:
            self.side_ops += 1
        if func.namespace not in ("aten", "prim") or name not in self._allowed:
            msg = f"{qual} called inside ModelNew.forward (only allocation, view, metadata and copy ops are allowed)"
            self.violations.append(msg)
            raise ForbiddenOpError(msg)
        if name == "_to_copy" and args and isinstance(args[0], torch.Tensor):
            dt = kwargs.get("dtype")
            if dt is not None and dt != args[0].dtype:
                msg = f"{qual} converting {args[0].dtype} to {dt} inside ModelNew.forward (a dtype cast is compute)"
                self.violations.append(msg)
                raise ForbiddenOpError(msg)
        if name in ("copy_", "_copy_from") and len(args) >= 2 and isinstance(args[1], torch.Tensor):
            if args[0].dtype != args[1].dtype:
                msg = f"{qual} from {args[1].dtype} into {args[0].dtype} inside ModelNew.forward (a dtype cast)"
                self.violations.append(msg)
                raise ForbiddenOpError(msg)
        out = func(*args, **kwargs)
        if isinstance(out, torch.Tensor) and name in self._fresh:
            self.fresh.add(out.untyped_storage().data_ptr())
            if self.poison and name in self._poison_alloc:
                self._poison_fn(out)
        return out


_DISPATCH = ComputeGuard.__torch_dispatch__
