"""The byte channel between the trusted side and a candidate worker: length-prefixed msgpack over pipes.

Nothing here executes code while decoding (no pickle): a candidate can send malformed bytes, never objects.
Tensors travel as {"__tensor__": 1, "dtype": "float32", "shape": [...], "data": raw bytes}; tuples as
{"__tuple__": [...]}, so the structure of a model's output survives the trip.
"""

from __future__ import annotations

import os
import select
import struct
import time
from typing import Any

import msgpack

_HDR = struct.Struct("<Q")


class ChannelClosed(EOFError):
    """The other end closed the pipe (it exited or crashed)."""


class ChannelTimeout(TimeoutError):
    """No complete message arrived before the deadline."""


class MessageTooLarge(ValueError):
    """A message announced more bytes than the receiver accepts."""


SPILL_MIN_BYTES = 1 << 20


def encode_value(v: Any, spill_dir: str | None = None) -> Any:
    """Nested tensors / tuples / lists / dicts / scalars -> msgpack-able plain values. Tensors are copied to CPU.

    With spill_dir, tensors of at least SPILL_MIN_BYTES are written to a fresh file there (random name, created
    with O_EXCL, so a planted symlink is never followed) and the record carries the file name instead of the bytes.
    """
    import torch

    if isinstance(v, torch.Tensor):
        t = v.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        t = t.contiguous()
        rec = {"__tensor__": 1, "dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape)}
        raw = t.reshape(-1).view(torch.uint8).numpy() if t.numel() else None
        if spill_dir is not None and raw is not None and raw.nbytes >= SPILL_MIN_BYTES:
            import secrets

            name = f"t_{secrets.token_hex(12)}.bin"
            fd = os.open(os.path.join(spill_dir, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
            with os.fdopen(fd, "wb") as f:
                f.write(memoryview(raw))
            rec["file"] = name
        else:
            rec["data"] = raw.tobytes() if raw is not None else b""
        return rec
    if isinstance(v, tuple):
        return {"__tuple__": [encode_value(x, spill_dir) for x in v]}
    if isinstance(v, list):
        return [encode_value(x, spill_dir) for x in v]
    if isinstance(v, dict):
        return {str(k): encode_value(x, spill_dir) for k, x in v.items()}
    if v is None or isinstance(v, (bool, int, float, str, bytes)):
        return v
    if hasattr(v, "__index__"):
        return int(v)
    if hasattr(v, "__float__"):
        return float(v)
    raise TypeError(f"cannot send a value of type {type(v).__name__}")


_DTYPES = {"float32", "float64", "float16", "bfloat16", "int8", "uint8", "int16", "int32", "int64", "bool",
           "complex64", "complex128"}


def _read_spilled(spill_dir: str | None, name: Any, nbytes: int) -> bytearray:
    import stat

    if spill_dir is None or not isinstance(name, str) or "/" in name or name.startswith("."):
        raise ValueError(f"tensor record names an unusable file {name!r}")
    try:
        fd = os.open(os.path.join(spill_dir, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as e:
        raise ValueError(f"tensor file {name!r}: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size != nbytes:
            raise ValueError(f"tensor file {name!r} is not a regular file of {nbytes} bytes")
        buf = bytearray(nbytes)
        view = memoryview(buf)
        got = 0
        while got < nbytes:
            n = os.readv(fd, [view[got:]])
            if n <= 0:
                raise ValueError(f"tensor file {name!r} is shorter than announced")
            got += n
        return buf
    finally:
        os.close(fd)
        try:
            os.unlink(os.path.join(spill_dir, name))
        except OSError:
            pass


def decode_value(v: Any, spill_dir: str | None = None, shm: Any = None) -> Any:
    """Inverse of encode_value (spilled tensors are read from spill_dir and their files removed). Records of
    tensors in a shared segment ({"shm": offset}, sandbox.shm) become read-only views of `shm` (an InputMapping).

    Raises ValueError for a malformed tensor record (wrong byte count, bad dtype, a file that is not a regular
    file of the announced size, a path outside spill_dir, a segment record without a segment)."""
    import torch

    if isinstance(v, dict):
        if "__tensor__" in v and "shm" in v:
            if shm is None:
                raise ValueError("tensor record names a shared segment this process does not have")
            return shm.tensor(v)
        if "__tensor__" in v:
            dtype = v.get("dtype")
            if dtype not in _DTYPES:
                raise ValueError(f"tensor record has unsupported dtype {dtype!r}")
            shape = [int(s) for s in v["shape"]]
            if any(s < 0 for s in shape):
                raise ValueError(f"tensor record has a negative dimension {shape}")
            dt = getattr(torch, dtype)
            numel = 1
            for s in shape:
                numel *= s
            itemsize = torch.empty((), dtype=dt).element_size()
            data = _read_spilled(spill_dir, v["file"], numel * itemsize) if "file" in v else v.get("data")
            if not isinstance(data, (bytes, bytearray)) or len(data) != numel * itemsize:
                raise ValueError(f"tensor record of shape {shape} {dtype} carries {len(data)} bytes, "
                                 f"expected {numel * itemsize}")
            if numel == 0:
                return torch.empty(shape, dtype=dt)
            buf = data if isinstance(data, bytearray) else bytearray(data)
            return torch.frombuffer(buf, dtype=dt).reshape(shape)
        if "__tuple__" in v:
            return tuple(decode_value(x, spill_dir, shm) for x in v["__tuple__"])
        return {k: decode_value(x, spill_dir, shm) for k, x in v.items()}
    if isinstance(v, list):
        return [decode_value(x, spill_dir, shm) for x in v]
    return v


def send(fd: int, msg: Any, timeout_s: float | None = None) -> None:
    """Write one message (a msgpack-able value) to a pipe fd.

    With timeout_s, the fd must be non-blocking (os.set_blocking(fd, False)) and ChannelTimeout is raised when the
    reader does not drain the pipe in time (a hung candidate). Raises ChannelClosed when the reader is gone.
    """
    payload = msgpack.packb(msg, use_bin_type=True)
    buf = memoryview(_HDR.pack(len(payload)) + payload)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    try:
        while buf:
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ChannelTimeout("the reader did not take the message in time")
                _, w, _ = select.select([], [fd], [], left)
                if not w:
                    continue
            try:
                n = os.write(fd, buf[: 1 << 20])
            except BlockingIOError:
                continue
            buf = buf[n:]
    except (BrokenPipeError, ConnectionError) as e:
        raise ChannelClosed(str(e)) from None
    except OSError as e:
        if isinstance(e, (ChannelTimeout,)):
            raise
        raise ChannelClosed(str(e)) from None


def _read_exact(fd: int, n: int, deadline: float | None) -> bytes:
    chunks: list[bytes] = []
    got = 0
    while got < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ChannelTimeout("deadline passed")
            r, _, _ = select.select([fd], [], [], left)
            if not r:
                raise ChannelTimeout("deadline passed")
        b = os.read(fd, min(n - got, 1 << 22))
        if not b:
            raise ChannelClosed("pipe closed")
        chunks.append(b)
        got += len(b)
    return b"".join(chunks)


def recv(fd: int, timeout_s: float | None = None, max_bytes: int = 1 << 31) -> Any:
    """Read one message. Raises ChannelTimeout, ChannelClosed, MessageTooLarge or ValueError (bad msgpack)."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    (n,) = _HDR.unpack(_read_exact(fd, _HDR.size, deadline))
    if n > max_bytes:
        raise MessageTooLarge(f"message of {n} bytes exceeds the limit of {max_bytes}")
    payload = _read_exact(fd, n, deadline)
    try:
        return msgpack.unpackb(payload, raw=False, strict_map_key=False, max_bin_len=max_bytes,
                               max_str_len=max_bytes)
    except Exception as e:  # msgpack raises several types for malformed input
        raise ValueError(f"malformed message: {type(e).__name__}: {e}") from None
