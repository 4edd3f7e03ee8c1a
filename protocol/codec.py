"""Wire codec: one small msgpack header frame per message, then each array as raw bytes in its own frame(s).

Frames of one message (a ZeroMQ multipart message; a socket pattern may put envelope frames before them):

  frame 0   msgpack map {"v": PROTOCOL_VERSION, "type": str, "body": map, "arrays": [[name, dtype, shape,
            nframes], ...]}
  frame 1.. the raw little-endian bytes of each array in `arrays` order; an array larger than `split_bytes`
            (default 2 GiB, so every array of 4 GiB and more) spans `nframes` consecutive frames.

Decoding is zero-copy for arrays in one frame: `np.frombuffer` over the received ZeroMQ frame (the array is
read-only and keeps the frame alive). A split array is joined into one new buffer (one copy). Every size is
bounded by `Limits` before anything is allocated, map keys must be str (checked per field, so the error
names the map), and the message class named in the header must be one the caller expects.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence, TypeVar

import ml_dtypes
import msgpack
import numpy as np
import zmq

from protocol.errors import ProtocolError
from protocol.message import Message

M = TypeVar("M", bound=Message)

#: Wire protocol version, carried in every header as "v"; a peer speaking another version is refused.
PROTOCOL_VERSION = 1

#: Default size above which one array is split over several frames (bytes). Below msgpack's and older
#: libraries' 4 GiB limits for one length field.
SPLIT_BYTES = 1 << 31

#: dtypes that may travel, by their wire name (always little-endian). bfloat16 and float8 come from ml_dtypes.
DTYPES: dict[str, np.dtype] = {
    name: np.dtype(t).newbyteorder("<")
    for name, t in {
        "bool": np.bool_, "int8": np.int8, "uint8": np.uint8, "int16": np.int16, "uint16": np.uint16,
        "int32": np.int32, "uint32": np.uint32, "int64": np.int64, "uint64": np.uint64,
        "float16": np.float16, "float32": np.float32, "float64": np.float64,
        "bfloat16": ml_dtypes.bfloat16, "float8_e4m3fn": ml_dtypes.float8_e4m3fn,
        "float8_e5m2": ml_dtypes.float8_e5m2,
    }.items()
}

MAX_NDIM = 8


@dataclasses.dataclass(frozen=True)
class Limits:
    """Bounds applied to untrusted input before decoding (bytes unless said otherwise).

    Fields:
      max_header_bytes: size of the msgpack header frame.
      max_str_bytes: one msgpack str inside the header.
      max_items: elements of one msgpack list or map inside the header.
      max_arrays: arrays in one message.
      max_array_bytes: one array.
      max_frame_bytes: one ZeroMQ frame; also set as the socket's ZMQ_MAXMSGSIZE (larger frames make
        ZeroMQ drop the connection before the bytes reach Python).
      max_frames: frames in one message (after any envelope).
      max_message_bytes: all frames of one message together.
    """

    max_header_bytes: int = 16 << 20
    max_str_bytes: int = 8 << 20
    max_items: int = 1 << 16
    max_arrays: int = 16
    max_array_bytes: int = 1 << 30
    max_frame_bytes: int = SPLIT_BYTES
    max_frames: int = 64
    max_message_bytes: int = 2 << 30

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if not isinstance(v, int) or v <= 0:
                raise ValueError(f"Limits.{f.name} must be a positive int, got {v!r}")

    @property
    def zmq_maxmsgsize(self) -> int:
        """Value for ZMQ_MAXMSGSIZE: the largest single frame this side accepts."""
        return max(self.max_header_bytes, self.max_frame_bytes)


def dtype_name(dtype: np.dtype) -> str:
    """Wire name of a dtype. Raises ProtocolError for dtypes that may not travel."""
    for name, dt in DTYPES.items():
        if dtype == dt or (dtype.byteorder in "=|" and dtype == dt.newbyteorder("=")):
            return name
    raise ProtocolError("dtype", f"{dtype} cannot travel (allowed: {sorted(DTYPES)})")


def encode(msg: Message, *, split_bytes: int = SPLIT_BYTES) -> list[Any]:
    """Frames of `msg`: [header bytes, array frames...] (memoryviews over the arrays, no copy).

    The caller must not modify an array until ZeroMQ has released its frames (send with `track=True` and
    wait on the tracker, or never reuse the buffer); `protocol.sockets.send_message` does the tracking.

    Raises:
      ProtocolError: an array of a dtype that may not travel.
    """
    if split_bytes <= 0:
        raise ValueError(f"split_bytes must be positive, got {split_bytes}")
    table, frames = [], []
    for name, arr in msg.wire_arrays().items():
        if arr.dtype.byteorder == ">":
            arr = arr.astype(arr.dtype.newbyteorder("<"))
        arr = arr if arr.flags.c_contiguous else arr.copy(order="C")  # (ascontiguousarray turns 0-d into 1-d)
        raw = memoryview(arr.reshape(-1).view(np.uint8))
        parts = [raw[i:i + split_bytes] for i in range(0, len(raw), split_bytes)] or [raw]
        table.append([name, dtype_name(arr.dtype), list(arr.shape), len(parts)])
        frames.extend(parts)
    header = msgpack.packb({"v": PROTOCOL_VERSION, "type": msg.TYPE, "body": msg.wire_body(), "arrays": table})
    return [header, *frames]


def _buffer(frame: Any) -> memoryview:
    if isinstance(frame, zmq.Frame):
        return frame.buffer
    return memoryview(frame)


def decode(frames: Sequence[Any], expect: Sequence[type[M]], limits: Limits = Limits()) -> M:
    """Decode one message whose class is one of `expect` from its frames (zmq.Frame, bytes or memoryview).

    Returns an instance of the class named in the header; its arrays are read-only views over the frames.

    Raises:
      ProtocolError: naming the field: "frames" (count / sizes), "header" (not msgpack, too big),
        "header.v" (other protocol version), "header.type" (a class not in `expect`),
        "header.arrays[i]..." (bad table), or "<Type>.<field>" from the message's own checks.
    """
    if not frames:
        raise ProtocolError("frames", "empty message")
    if len(frames) > limits.max_frames:
        raise ProtocolError("frames", f"{len(frames)} frames, limit {limits.max_frames}")
    bufs = [_buffer(f) for f in frames]
    total = sum(b.nbytes for b in bufs)
    if total > limits.max_message_bytes:
        raise ProtocolError("frames", f"message of {total} bytes exceeds {limits.max_message_bytes}")
    head = bufs[0]
    if head.nbytes > limits.max_header_bytes:
        raise ProtocolError("header", f"{head.nbytes} bytes exceeds {limits.max_header_bytes}")
    try:
        header = msgpack.unpackb(
            head, strict_map_key=False, max_str_len=limits.max_str_bytes, max_bin_len=0, max_ext_len=0,
            max_array_len=limits.max_items, max_map_len=limits.max_items,
        )
    except Exception as e:  # msgpack raises several types (ExtraData, ValueError, FormatError, ...)
        raise ProtocolError("header", f"not a valid msgpack header ({type(e).__name__}: {e})"[:300]) from None
    if not isinstance(header, dict):
        raise ProtocolError("header", f"must be a map, got {type(header).__name__}")
    unknown = set(header) - {"v", "type", "body", "arrays"}
    if unknown:
        raise ProtocolError(f"header.{sorted(map(str, unknown))[0]:.64}", "unknown header field")
    version = header.get("v")
    if isinstance(version, bool) or not isinstance(version, int):
        raise ProtocolError("header.v", f"protocol version must be an int, got {type(version).__name__}")
    if version != PROTOCOL_VERSION:
        raise ProtocolError("header.v", f"protocol version {version}; this side speaks {PROTOCOL_VERSION}")
    type_name = header.get("type")
    cls = next((c for c in expect if c.TYPE == type_name), None)
    if cls is None:
        raise ProtocolError("header.type", f"{str(type_name)[:64]!r} is not expected here "
                                           f"(expected {[c.TYPE for c in expect]})")
    if "body" not in header:
        raise ProtocolError("header.body", "missing")
    arrays = _decode_arrays(cls, header.get("arrays"), bufs[1:], limits)
    return cls.from_wire(header["body"], arrays)


def _decode_arrays(cls: type[Message], table: Any, bufs: list[memoryview], limits: Limits) -> dict[str, np.ndarray]:
    if not isinstance(table, list):
        raise ProtocolError("header.arrays", f"must be a list, got {type(table).__name__}")
    if len(table) > limits.max_arrays:
        raise ProtocolError("header.arrays", f"{len(table)} arrays, limit {limits.max_arrays}")
    names = [row[0] if isinstance(row, list) and row else None for row in table]
    if sorted(map(str, names)) != sorted(cls.ARRAYS) or len(set(names)) != len(names):
        raise ProtocolError("header.arrays", f"names {names!r:.200} do not match {cls.TYPE}'s arrays {list(cls.ARRAYS)}")
    out: dict[str, np.ndarray] = {}
    pos = 0
    for i, row in enumerate(table):
        where = f"header.arrays[{i}]"
        if len(row) != 4:
            raise ProtocolError(where, "must be [name, dtype, shape, nframes]")
        name, dt_name, shape, nframes = row
        dtype = DTYPES.get(dt_name) if isinstance(dt_name, str) else None
        if dtype is None:
            raise ProtocolError(f"{where}.dtype", f"{str(dt_name)[:64]!r} is not one of {sorted(DTYPES)}")
        if not isinstance(shape, list) or len(shape) > MAX_NDIM:
            raise ProtocolError(f"{where}.shape", f"must be a list of at most {MAX_NDIM} ints")
        if any(isinstance(d, bool) or not isinstance(d, int) or d < 0 for d in shape):
            raise ProtocolError(f"{where}.shape", f"dimensions must be non-negative ints, got {shape!r:.100}")
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes > limits.max_array_bytes:
            raise ProtocolError(f"{where}.shape", f"{nbytes} bytes exceeds {limits.max_array_bytes}")
        if isinstance(nframes, bool) or not isinstance(nframes, int) or nframes < 1 or pos + nframes > len(bufs):
            raise ProtocolError(f"{where}.nframes", f"{nframes!r:.32} frames, {len(bufs) - pos} left in the message")
        parts = bufs[pos:pos + nframes]
        pos += nframes
        got = sum(p.nbytes for p in parts)
        if got != nbytes:
            raise ProtocolError(f"{cls.TYPE}.{name}", f"shape {shape} of {dt_name} needs {nbytes} bytes, frames hold {got}")
        if nframes == 1:
            flat = np.frombuffer(parts[0], dtype=np.uint8)
            flat.flags.writeable = False  # a view of the received frame (pyzmq's frame buffers are writable)
        else:
            flat = np.empty(nbytes, dtype=np.uint8)
            at = 0
            for p in parts:
                flat[at:at + p.nbytes] = np.frombuffer(p, dtype=np.uint8)
                at += p.nbytes
        out[name] = flat.view(dtype).reshape(shape)
    if pos != len(bufs):
        raise ProtocolError("frames", f"{len(bufs) - pos} frame(s) beyond the arrays in the header")
    return out
