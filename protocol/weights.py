"""Weights messages (learner -> actors): `WeightsRequest`, `WeightsManifest`, `WeightsChunkRequest`,
`WeightsChunk`.

A version's tensors are laid out back to back (each start aligned to `ALIGN_BYTES`) in one byte stream of
`total_bytes`, cut into chunks of `chunk_bytes` (the last one shorter). The manifest lists a crc32 per chunk
and a `checksum` over the layout and those crc32s, so a fetcher verifies every byte before it hands tensors
over (see `protocol.weights_channel`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import struct
from typing import ClassVar, Mapping

import numpy as np

from protocol.codec import DTYPES, MAX_NDIM, dtype_name
from protocol.errors import ProtocolError
from protocol.message import (Message, check_array, check_int, check_int_list, check_text, check_text_list,
                              set_field)

#: Every tensor starts at a multiple of this many bytes in the byte stream (so views are aligned).
ALIGN_BYTES = 64
#: Most tensors in one manifest.
MAX_TENSORS = 1 << 16


@dataclasses.dataclass(frozen=True, eq=False)
class WeightsRequest(Message):
    """Actor -> publisher: send me the newest manifest. known_version: the version the actor holds (-1:
    none); informative for the publisher's statistics, the reply is always the newest manifest."""

    TYPE: ClassVar[str] = "WeightsRequest"
    actor_id: str
    known_version: int = -1

    def __post_init__(self) -> None:
        check_text(self.TYPE, "actor_id", self.actor_id)
        set_field(self, "known_version", check_int(self.TYPE, "known_version", self.known_version, lo=-1))


@dataclasses.dataclass(frozen=True, eq=False)
class WeightsManifest(Message):
    """One published weights version.

    Fields:
      version: policy version (>= 0), increasing over a run.
      names, dtypes, shapes: per tensor, in byte-stream order (dtype by wire name, e.g. "bfloat16").
      offsets: per tensor, byte offset of its first byte in the stream.
      total_bytes: length of the byte stream.
      chunk_bytes: size of every chunk but the last.
      chunk_crc32: per chunk, the CRC-32 of its bytes (`protocol.checksum.crc32`, equal to zlib.crc32).
      checksum: hex sha256 over the layout and `chunk_crc32` (`layout_checksum`), i.e. a two-level digest
        of the whole stream.

    Raises:
      ProtocolError: lists of different lengths, overlapping or out-of-range tensors, a chunk count that
        does not match, or a checksum that does not match the layout.
    """

    TYPE: ClassVar[str] = "WeightsManifest"
    version: int
    names: tuple[str, ...]
    dtypes: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    offsets: tuple[int, ...]
    total_bytes: int
    chunk_bytes: int
    chunk_crc32: tuple[int, ...]
    checksum: str

    def __post_init__(self) -> None:
        t = self.TYPE
        set_field(self, "version", check_int(t, "version", self.version, lo=0))
        names = check_text_list(t, "names", self.names, max_items=MAX_TENSORS)
        if len(set(names)) != len(names):
            raise ProtocolError(f"{t}.names", "duplicate tensor names")
        set_field(self, "names", names)
        dtypes = check_text_list(t, "dtypes", self.dtypes, max_items=MAX_TENSORS)
        for i, d in enumerate(dtypes):
            check_text(t, f"dtypes[{i}]", d, choices=DTYPES)
        set_field(self, "dtypes", dtypes)
        if not isinstance(self.shapes, (list, tuple)):
            raise ProtocolError(f"{t}.shapes", "expected a list of shapes")
        shapes = tuple(check_int_list(t, f"shapes[{i}]", s, max_items=MAX_NDIM, lo=0) for i, s in enumerate(self.shapes))
        set_field(self, "shapes", shapes)
        set_field(self, "offsets", check_int_list(t, "offsets", self.offsets, max_items=MAX_TENSORS, lo=0))
        set_field(self, "total_bytes", check_int(t, "total_bytes", self.total_bytes, lo=0, hi=2**62))
        set_field(self, "chunk_bytes", check_int(t, "chunk_bytes", self.chunk_bytes, lo=1, hi=2**31))
        set_field(self, "chunk_crc32", check_int_list(t, "chunk_crc32", self.chunk_crc32, max_items=1 << 24,
                                                      lo=0, hi=2**32 - 1))
        check_text(t, "checksum", self.checksum, max_len=64)
        if not len(names) == len(dtypes) == len(shapes) == len(self.offsets):
            raise ProtocolError(f"{t}.names", "names, dtypes, shapes and offsets differ in length")
        end = 0
        for i in range(len(names)):
            if self.offsets[i] < end:
                raise ProtocolError(f"{t}.offsets[{i}]", "overlaps the previous tensor")
            end = self.offsets[i] + self.tensor_bytes(i)
        if end > self.total_bytes:
            raise ProtocolError(f"{t}.total_bytes", f"{self.total_bytes} < end of the last tensor ({end})")
        if len(self.chunk_crc32) != self.num_chunks:
            raise ProtocolError(f"{t}.chunk_crc32", f"{len(self.chunk_crc32)} entries for {self.num_chunks} chunks")
        if self.checksum != layout_checksum(self.version, names, dtypes, shapes, self.offsets, self.total_bytes,
                                            self.chunk_bytes, self.chunk_crc32):
            raise ProtocolError(f"{t}.checksum", "does not match the layout and chunk crc32s")

    @property
    def num_chunks(self) -> int:
        return math.ceil(self.total_bytes / self.chunk_bytes)

    def chunk_range(self, index: int) -> tuple[int, int]:
        """[start, stop) byte range of chunk `index` in the stream."""
        start = index * self.chunk_bytes
        return start, min(start + self.chunk_bytes, self.total_bytes)

    def tensor_bytes(self, i: int) -> int:
        return math.prod(self.shapes[i]) * DTYPES[self.dtypes[i]].itemsize

    def tensors_from(self, stream: np.ndarray) -> dict[str, np.ndarray]:
        """Views of each tensor into `stream` (uint8 [total_bytes]); no copy."""
        out = {}
        for i, name in enumerate(self.names):
            start = self.offsets[i]
            raw = stream[start:start + self.tensor_bytes(i)]
            out[name] = raw.view(DTYPES[self.dtypes[i]]).reshape(self.shapes[i])
        return out


def layout_checksum(version: int, names, dtypes, shapes, offsets, total_bytes: int, chunk_bytes: int,
                    chunk_crc32) -> str:
    """hex sha256 over version, names, dtypes, shapes, offsets, sizes and the per-chunk crc32s."""
    h = hashlib.sha256()
    h.update(struct.pack("<QQQQ", version, total_bytes, chunk_bytes, len(names)))
    for name, dt, shape, off in zip(names, dtypes, shapes, offsets):
        h.update(name.encode() + b"\0" + dt.encode() + b"\0")
        h.update(struct.pack(f"<Q{len(shape)}QQ", len(shape), *shape, off))
    h.update(np.asarray(chunk_crc32, dtype="<u4").tobytes())
    return h.hexdigest()


def plan_layout(tensors: Mapping[str, np.ndarray]) -> tuple[list[int], int]:
    """Byte offsets of each tensor (in mapping order, aligned to ALIGN_BYTES) and the stream length."""
    offsets, end = [], 0
    for arr in tensors.values():
        start = -(-end // ALIGN_BYTES) * ALIGN_BYTES
        offsets.append(start)
        end = start + arr.nbytes
    return offsets, end


def build_manifest(version: int, tensors: Mapping[str, np.ndarray], offsets: list[int], total_bytes: int,
                   chunk_bytes: int, chunk_crc32: list[int]) -> WeightsManifest:
    """A manifest for `tensors` laid out at `offsets`, with its checksum filled in."""
    fields = dict(
        version=version, names=tuple(tensors), dtypes=tuple(dtype_name(a.dtype) for a in tensors.values()),
        shapes=tuple(tuple(a.shape) for a in tensors.values()), offsets=tuple(offsets), total_bytes=total_bytes,
        chunk_bytes=chunk_bytes, chunk_crc32=tuple(chunk_crc32),
    )
    return WeightsManifest(**fields, checksum=layout_checksum(**fields))  # type: ignore[arg-type]


@dataclasses.dataclass(frozen=True, eq=False)
class WeightsChunkRequest(Message):
    """Actor -> publisher: send chunk `index` of `version` (one credit of the window)."""

    TYPE: ClassVar[str] = "WeightsChunkRequest"
    version: int
    index: int

    def __post_init__(self) -> None:
        set_field(self, "version", check_int(self.TYPE, "version", self.version, lo=0))
        set_field(self, "index", check_int(self.TYPE, "index", self.index, lo=0, hi=2**40))


@dataclasses.dataclass(frozen=True, eq=False)
class WeightsChunk(Message):
    """Publisher -> actor: chunk `index` of `version`; data: uint8 [n] bytes of the stream."""

    TYPE: ClassVar[str] = "WeightsChunk"
    ARRAYS: ClassVar[tuple[str, ...]] = ("data",)
    version: int
    index: int
    data: np.ndarray

    def __post_init__(self) -> None:
        set_field(self, "version", check_int(self.TYPE, "version", self.version, lo=0))
        set_field(self, "index", check_int(self.TYPE, "index", self.index, lo=0, hi=2**40))
        set_field(self, "data", check_array(self.TYPE, "data", self.data, dtype=np.uint8, ndim=1))
