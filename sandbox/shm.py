"""Input sets from the trusted worker to a candidate worker through one shared, sealed memory segment.

Why: fresh inputs for every timed call mean megabytes per call; sending them as msgpack bytes or spill files
costs an encode, a file write, a read and a decode per set (tens of ms for 8 MiB on a 2-core host), more than many
timed calls. Here the trusted side copies each set once into a segment both processes map; the candidate reads it
in place.

What is trusted, and why it holds:
- The segment is a memfd (`memfd_create`, MFD_ALLOW_SEALING) made by the trusted side for one candidate process
  and handed to it when the process is created, before any solution code exists. The trusted side sizes it, maps
  it read-write, and only then seals it (F_SEAL_SHRINK, F_SEAL_GROW, F_SEAL_FUTURE_WRITE, F_SEAL_SEAL) before the
  candidate's `setup`: from then on nobody but the trusted side's existing mapping can write it (write(2), new
  writable shared mappings, mprotect to writable, hole punching and resizing all fail, also through a reopened
  /proc/self/fd link), so input memory the candidate is given is read-only to it.
- The trusted side never reads the segment back: its own copies of the inputs (the reference's and the
  baselines') stay in its private memory, so nothing the candidate could do to the segment (were a seal missing
  on an old kernel) reaches an expected output.
- What is in the segment: only the request in flight (one verification trial's set, or the sets of one timed
  repetition, written by the trusted side after the previous request was answered). The candidate never sees a
  seed, and never the inputs of a later request: they are written after it answered the current one.
- Records are the trusted side's (offsets, dtypes, shapes); the candidate still checks bounds before it maps a
  view, and every tensor view owns exactly its own bytes (no storage reaches a neighbour).

Record of a tensor in the segment: {"__tensor__": 1, "dtype": "float32", "shape": [...], "shm": offset} (the
rest of a value's structure as in sandbox.wire). A value that does not fit (or a process without a segment) travels
through sandbox.wire as before.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import warnings
from typing import Any

ALIGN = 4096
F_SEAL_SEAL, F_SEAL_SHRINK, F_SEAL_GROW, F_SEAL_FUTURE_WRITE = 0x1, 0x2, 0x4, 0x10
_DTYPES = {"float32", "float64", "float16", "bfloat16", "int8", "uint8", "int16", "int32", "int64", "bool",
           "complex64", "complex128"}


def create_fd() -> int | None:
    """A fresh, empty, sealable memfd for one candidate process (close-on-exec: it is passed explicitly), or None
    where memfds are not available (the wire is used then)."""
    try:
        return os.memfd_create("cuda-agent-inputs", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    except (AttributeError, OSError):
        return None


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def tensor_bytes(v: Any) -> int:
    """Bytes a value takes in a segment (each tensor aligned to ALIGN)."""
    import torch

    if isinstance(v, torch.Tensor):
        return _align(v.numel() * v.element_size())
    if isinstance(v, (list, tuple)):
        return sum(tensor_bytes(x) for x in v)
    if isinstance(v, dict):
        return sum(tensor_bytes(x) for x in v.values())
    return 0


class InputSegment:
    """The trusted side of a segment: `size(n)` once (then sealed), `encode(value)` per request."""

    def __init__(self, fd: int):
        self.fd = fd
        self.nbytes = 0
        self.sealed_write = False
        self._mm: mmap.mmap | None = None
        self._buf: Any = None

    def size(self, nbytes: int) -> None:
        """Give the segment nbytes (rounded up to ALIGN), map it here, seal it. Call before the candidate's setup."""
        import torch

        nbytes = _align(max(nbytes, ALIGN))
        os.ftruncate(self.fd, nbytes)
        self._mm = mmap.mmap(self.fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self._buf = torch.frombuffer(self._mm, dtype=torch.uint8)
        try:
            fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL)
            self.sealed_write = True
        except OSError:  # a kernel before 5.1 has no F_SEAL_FUTURE_WRITE: keep the size fixed at least
            fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)
        self.nbytes = nbytes

    def encode(self, v: Any) -> Any | None:
        """Copy the tensors of v into the segment (from offset 0: the previous request's contents are gone) and
        return v's record, or None when v does not fit (send it through sandbox.wire then)."""
        planned = self.plan(v)
        if planned is None:
            return None
        rec, write = planned
        write()
        return rec

    def plan(self, v: Any) -> tuple[Any, Any] | None:
        """(v's record, a function that copies v's tensors into the segment), or None when v does not fit. The
        record may be sent before the copies are made, to a reader that only makes views of it (which read
        nothing) and does not touch the data before a later request."""
        if self._buf is None or tensor_bytes(v) > self.nbytes:
            return None
        copies: list[tuple[int, Any]] = []
        rec = self._put(v, [0], copies)

        def write() -> None:
            import torch

            for off, t in copies:
                n = t.numel() * t.element_size()
                self._buf[off:off + n].copy_(t.reshape(-1).view(torch.uint8))

        return rec, write

    def _put(self, v: Any, pos: list[int], copies: list) -> Any:
        import torch

        from sandbox import wire

        if isinstance(v, torch.Tensor):
            t = v.detach().contiguous()  # a device tensor is copied into the segment by write(): one copy, no staging
            n = t.numel() * t.element_size()
            off = pos[0]
            if n:
                copies.append((off, t))
            pos[0] = off + _align(n)
            return {"__tensor__": 1, "dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape), "shm": off}
        if isinstance(v, tuple):
            return {"__tuple__": [self._put(x, pos, copies) for x in v]}
        if isinstance(v, list):
            return [self._put(x, pos, copies) for x in v]
        if isinstance(v, dict):
            return {str(k): self._put(x, pos, copies) for k, x in v.items()}
        return wire.encode_value(v)

    def close(self) -> None:
        self._buf = None
        if self._mm is not None:
            try:
                self._mm.close()
            except BufferError:  # a view still exported: the mapping goes with the process
                pass
            self._mm = None
        try:
            os.close(self.fd)
        except OSError:
            pass


class InputMapping:
    """The candidate's side: a read-only mapping of the segment; `tensor(record)` is a view of one tensor."""

    def __init__(self, fd: int, nbytes: int):
        self.nbytes = nbytes
        self._mm = mmap.mmap(fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ)
        os.close(fd)
        self.base = 0
        import torch

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch warns that the buffer is not writable: that is the point
            probe = torch.frombuffer(self._mm, dtype=torch.uint8, count=1)
        self.base = probe.data_ptr()

    def tensor(self, rec: dict) -> Any:
        """The view of a segment record (raises ValueError for a record outside the segment or of a bad dtype)."""
        import torch

        dtype = rec.get("dtype")
        if dtype not in _DTYPES:
            raise ValueError(f"segment record has unsupported dtype {dtype!r}")
        shape = [int(s) for s in rec["shape"]]
        if any(s < 0 for s in shape):
            raise ValueError(f"segment record has a negative dimension {shape}")
        dt = getattr(torch, dtype)
        numel = 1
        for s in shape:
            numel *= s
        if numel == 0:
            return torch.empty(shape, dtype=dt)
        off = int(rec["shm"])
        n = numel * torch.empty((), dtype=dt).element_size()
        if off < 0 or off % ALIGN or off + n > self.nbytes:
            raise ValueError(f"segment record [{off}, {off + n}) lies outside the segment of {self.nbytes} bytes")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return torch.frombuffer(self._mm, dtype=dt, count=numel, offset=off).reshape(shape)

    def owns(self, t: Any) -> bool:
        """Whether tensor t views the segment (read-only memory: never scrub it)."""
        try:
            p = t.untyped_storage().data_ptr()
        except (AttributeError, RuntimeError):
            return False
        return self.base <= p < self.base + self.nbytes
