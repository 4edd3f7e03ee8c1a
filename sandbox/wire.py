"""The byte channel between the trusted side and a candidate worker: length-prefixed msgpack over pipes.

Nothing here executes code while decoding (no pickle): a candidate can send malformed bytes, never objects.
Tensors travel as {"__tensor__": 1, "dtype": "float32", "shape": [...], "data": raw bytes}; tuples as
{"__tuple__": [...]}, so the structure of a model's output survives the trip.

Large tensors travel as files in a spill folder (`SpillDir`): the trusted side opens that folder as a directory
fd before any candidate code exists and creates, reads and removes files only relative to that fd, one path
component at a time (O_NOFOLLOW, O_EXCL), so a candidate that renames the folder, or puts a symlink or a hard
link in it, never steers a file operation of the trusted side (which runs as root in the host's mount
namespace) anywhere else. A file it reads must be a regular file of the announced size with one link, owned by
the expected uid; a rejected file is never removed.

`private_channel()` gives the candidate worker's serve loop a send / recv pair bound, when it is made (before the
solution is imported), to the functions it calls (os.write, msgpack.packb, ...): replacing sandbox.wire.send, or
msgpack.packb, later does not reach the replies.
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


class SpillDir:
    """A spill folder reached through a directory fd (see module doc). `SpillDir.open(path, owner)`; `close()`.

    owner: the uid files read from it must belong to (the candidate's, on the trusted side); None = any.
    """

    def __init__(self, fd: int, path: str, owner: int | None = None):
        self.fd = fd
        self.path = path
        self.owner = owner

    @classmethod
    def open(cls, path: str, owner: int | None = None) -> "SpillDir":
        """Open path (a directory, not a symlink) now. Raises OSError when it is not one."""
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        return cls(fd, path, owner)

    def write(self, raw: Any) -> str:
        """A fresh file (random name, O_EXCL | O_NOFOLLOW in the opened folder) holding raw; its name."""
        import secrets

        name = f"t_{secrets.token_hex(12)}.bin"
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644,
                     dir_fd=self.fd)
        with os.fdopen(fd, "wb") as f:
            f.write(memoryview(raw))
        return name

    def read(self, name: Any, nbytes: int) -> bytearray:
        """The bytes of file `name` in the opened folder, which is then removed. Raises ValueError (and removes
        nothing) for a name with a slash or a leading dot, a symlink, a file that is not regular, not of nbytes,
        with more than one link, or not the owner's."""
        import stat

        if not isinstance(name, str) or not name or "/" in name or name.startswith(".") or "\0" in name:
            raise ValueError(f"tensor record names an unusable file {name!r}")
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=self.fd)
        except OSError as e:
            raise ValueError(f"tensor file {name!r}: {e.strerror}") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size != nbytes:
                raise ValueError(f"tensor file {name!r} is not a regular file of {nbytes} bytes")
            if st.st_nlink != 1:
                raise ValueError(f"tensor file {name!r} has {st.st_nlink} links (a hard link to another file)")
            if self.owner is not None and st.st_uid != self.owner:
                raise ValueError(f"tensor file {name!r} has owner uid {st.st_uid}, not {self.owner}")
            buf = bytearray(nbytes)
            view = memoryview(buf)
            got = 0
            while got < nbytes:
                n = os.readv(fd, [view[got:]])
                if n <= 0:
                    raise ValueError(f"tensor file {name!r} is shorter than announced")
                got += n
        finally:
            os.close(fd)
        try:  # accepted: remove it (relative to the folder's fd: a name in that folder, wherever it now is)
            os.unlink(name, dir_fd=self.fd)
        except OSError:
            pass
        return buf

    def close(self) -> None:
        if self.fd >= 0:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = -1


def _spill(spill_dir: "SpillDir | str | None") -> tuple["SpillDir | None", bool]:
    """(the SpillDir to use, whether to close it afterwards): a path is opened for the one call (callers that
    hand paths around get the same guarantees from the moment of the call on)."""
    if spill_dir is None or isinstance(spill_dir, SpillDir):
        return spill_dir, False
    return SpillDir.open(spill_dir), True


def encode_value(v: Any, spill_dir: "SpillDir | str | None" = None) -> Any:
    """Nested tensors / tuples / lists / dicts / scalars -> msgpack-able plain values. Tensors are copied to CPU.

    With spill_dir (a SpillDir, or a folder path), tensors of at least SPILL_MIN_BYTES are written to a fresh file
    there (SpillDir.write) and the record carries the file name instead of the bytes.
    """
    sd, close = _spill(spill_dir)
    try:
        import torch  # once per value, not per node (every import statement costs an import-hook round)

        return _encode(v, sd, torch)
    finally:
        if close:
            sd.close()  # type: ignore[union-attr]


def _encode(v: Any, spill_dir: "SpillDir | None", torch: Any) -> Any:
    if isinstance(v, torch.Tensor):
        t = v.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        t = t.contiguous()
        rec = {"__tensor__": 1, "dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape)}
        raw = t.reshape(-1).view(torch.uint8).numpy() if t.numel() else None
        if spill_dir is not None and raw is not None and raw.nbytes >= SPILL_MIN_BYTES:
            rec["file"] = spill_dir.write(raw)
        else:
            rec["data"] = raw.tobytes() if raw is not None else b""
        return rec
    if isinstance(v, tuple):
        return {"__tuple__": [_encode(x, spill_dir, torch) for x in v]}
    if isinstance(v, list):
        return [_encode(x, spill_dir, torch) for x in v]
    if isinstance(v, dict):
        return {str(k): _encode(x, spill_dir, torch) for k, x in v.items()}
    if v is None or isinstance(v, (bool, int, float, str, bytes)):
        return v
    if hasattr(v, "__index__"):
        return int(v)
    if hasattr(v, "__float__"):
        return float(v)
    raise TypeError(f"cannot send a value of type {type(v).__name__}")


_DTYPES = {"float32", "float64", "float16", "bfloat16", "int8", "uint8", "int16", "int32", "int64", "bool",
           "complex64", "complex128"}


def decode_value(v: Any, spill_dir: "SpillDir | str | None" = None, shm: Any = None) -> Any:
    """Inverse of encode_value (spilled tensors are read from spill_dir, SpillDir.read, and their files removed).
    Records of tensors in a shared segment ({"shm": offset}, sandbox.shm) become read-only views of `shm` (an
    InputMapping).

    Raises ValueError for a malformed tensor record (wrong byte count, bad dtype, a file that SpillDir.read
    rejects, a file record without a spill folder, a segment record without a segment)."""
    sd, close = _spill(spill_dir)
    try:
        import torch  # once per value, not per node

        return _decode(v, sd, shm, torch)
    finally:
        if close:
            sd.close()  # type: ignore[union-attr]


def _decode(v: Any, spill_dir: "SpillDir | None", shm: Any, torch: Any) -> Any:
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
            if "file" in v and spill_dir is None:
                raise ValueError("tensor record names a file but there is no spill folder")
            data = spill_dir.read(v["file"], numel * itemsize) if "file" in v else v.get("data")
            if not isinstance(data, (bytes, bytearray)) or len(data) != numel * itemsize:
                got = len(data) if isinstance(data, (bytes, bytearray)) else "no"
                raise ValueError(f"tensor record of shape {shape} {dtype} carries {got} bytes, "
                                 f"expected {numel * itemsize}")
            if numel == 0:
                return torch.empty(shape, dtype=dt)
            buf = data if isinstance(data, bytearray) else bytearray(data)
            return torch.frombuffer(buf, dtype=dt).reshape(shape)
        if "__tuple__" in v:
            return tuple(_decode(x, spill_dir, shm, torch) for x in v["__tuple__"])
        return {k: _decode(x, spill_dir, shm, torch) for k, x in v.items()}
    if isinstance(v, list):
        return [_decode(x, spill_dir, shm, torch) for x in v]
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


def private_channel() -> tuple[Any, Any]:
    """(send(fd, msg), recv(fd) -> msg): blocking framed msgpack, like `send` / `recv` without timeouts, bound now
    to the functions they use (see module doc). For the candidate worker, made before any solution code runs; the
    pair is kept only in the serve loop's frame. recv raises ChannelClosed or ValueError (malformed message)."""
    write, read, packb, unpackb = os.write, os.read, msgpack.packb, msgpack.unpackb
    pack, unpack, hsize = _HDR.pack, _HDR.unpack, _HDR.size
    mv, length, join = memoryview, len, b"".join
    closed, broken = ChannelClosed, (BrokenPipeError, ConnectionError, OSError)
    limit = 1 << 31

    def send(fd: int, msg: Any) -> None:
        payload = packb(msg, use_bin_type=True)
        buf = mv(pack(length(payload)) + payload)
        try:
            while buf:
                n = write(fd, buf[: 1 << 20])
                buf = buf[n:]
        except broken as e:
            raise closed(str(e)) from None

    def exact(fd: int, n: int) -> bytes:
        chunks = []
        got = 0
        while got < n:
            b = read(fd, min(n - got, 1 << 22))
            if not b:
                raise closed("pipe closed")
            chunks.append(b)
            got += length(b)
        return join(chunks)

    def recv(fd: int) -> Any:
        (n,) = unpack(exact(fd, hsize))
        if n > limit:
            raise ValueError(f"message of {n} bytes exceeds the limit of {limit}")
        payload = exact(fd, n)
        try:
            return unpackb(payload, raw=False, strict_map_key=False, max_bin_len=limit, max_str_len=limit)
        except Exception as e:  # noqa: BLE001 - msgpack raises several types for malformed input
            raise ValueError(f"malformed message: {type(e).__name__}") from None

    return send, recv
