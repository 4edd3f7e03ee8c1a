"""The learner's durable trajectory spool: append-only segment files, fsync'd, plus the persisted set of
seen episode ids.

An ack for a trajectory is sent only after its record is in a segment and `fdatasync` returned, so a
SIGKILL (or power loss) at any point loses nothing that was acked. Seen ids survive a restart: they are the
ids of the records still in the segments plus `seen.log`, where the ids of released (consumed and deleted)
segments go first. A torn record at the tail of the newest segment (a crash mid-write, never acked) fails
its crc32 and is cut off on open.

Folder layout:
  seg-<n>.spool   records: magic "TRJ1" | crc32 u32 | body_len u64 | id_len u16 | nframes u16 | id (utf-8) |
                  frame lengths u64 x nframes | frames (the message's wire frames, see protocol.codec).
                  crc32 covers everything after the crc field. All integers little-endian.
  seen.log        entries: id_len u16 | crc32 u32 (of the id) | id (utf-8).

Memory: the seen set is held in memory (about 100 bytes per episode id).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import struct
import threading
from pathlib import Path
from typing import Any, Sequence

from protocol.checksum import crc32
from protocol.codec import Limits, decode
from protocol.errors import ProtocolError
from protocol.trajectory import Trajectory

log = logging.getLogger(__name__)

_MAGIC = b"TRJ1"
_HEAD = struct.Struct("<4sI")         # magic, crc32
_FIXED = struct.Struct("<QHH")        # body_len, id_len, nframes
_SEEN = struct.Struct("<HI")          # id_len, crc32
_IOV_MAX = 512
#: Limits for reading back records (they passed the receiver's own limits when they arrived).
_READ_LIMITS = Limits(max_array_bytes=1 << 40, max_frame_bytes=1 << 40, max_message_bytes=1 << 40)


@dataclasses.dataclass(frozen=True, order=True)
class SpoolPosition:
    """A place in the spool: segment number and byte offset in it."""

    segment: int = 0
    offset: int = 0


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, bufs: list[Any]) -> int:
    """writev every buffer, coping with short writes; returns bytes written."""
    views = [memoryview(b).cast("B") for b in bufs if len(memoryview(b).cast("B"))]
    written = 0
    while views:
        n = os.writev(fd, views[:_IOV_MAX])
        written += n
        while views and n >= len(views[0]):
            n -= len(views[0])
            views.pop(0)
        if n:
            views[0] = views[0][n:]
    return written


class TrajectorySpool:
    """Durable store of trajectories in arrival order with exactly-once admission by episode id.

    Thread-safe: one receiver thread appends while a learner thread reads and releases.

    Args:
      directory: folder of the spool (created if missing).
      segment_bytes: start a new segment file once the current one is this big.
      fsync: fdatasync after each appended batch (turn off only in tests of something else).
    """

    def __init__(self, directory: str | Path, *, segment_bytes: int = 256 << 20, fsync: bool = True):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.segment_bytes = segment_bytes
        self.fsync = fsync
        self._lock = threading.Lock()
        self._grew = threading.Condition(self._lock)
        self._seen: set[str] = set()
        self._sizes: dict[int, int] = {}  # segment -> durable size
        self._read_seen_log()
        segments = self._segments()
        for seg in segments:
            self._sizes[seg] = self._scan_segment(seg, verify=seg == segments[-1])
        self._active = max(self._sizes, default=0)
        if not self._sizes:
            self._new_segment(0)
        self._fd = os.open(self._path(self._active), os.O_WRONLY | os.O_APPEND)

    # -- admission --------------------------------------------------------------------------------------
    def __contains__(self, episode_id: str) -> bool:
        with self._lock:
            return episode_id in self._seen

    @property
    def num_seen(self) -> int:
        with self._lock:
            return len(self._seen)

    def append(self, records: Sequence[tuple[str, Sequence[Any]]]) -> None:
        """Append records (episode id, wire frames as buffers) and make them durable before returning.

        The caller drops duplicates first (`episode_id in spool`); ids are added to the seen set here.

        Raises:
          OSError: the write or fdatasync failed; the segment is cut back to its previous length and none
            of the records counts as stored.
        """
        if not records:
            return
        bufs: list[Any] = []
        for episode_id, frames in records:
            ident = episode_id.encode()
            views = [memoryview(f).cast("B") for f in frames]
            lens = struct.pack(f"<{len(views)}Q", *(len(v) for v in views))
            body_len = len(ident) + len(lens) + sum(len(v) for v in views)
            fixed = _FIXED.pack(body_len, len(ident), len(views))
            crc = crc32(fixed)
            for part in (ident, lens, *views):
                crc = crc32(part, crc)
            bufs += [_HEAD.pack(_MAGIC, crc), fixed, ident, lens, *views]
        try:
            written = _write_all(self._fd, bufs)
            if self.fsync:
                os.fdatasync(self._fd)
        except OSError:
            # a partial record must not stay in front of later (acked) ones: cut the file back
            os.ftruncate(self._fd, self._sizes[self._active])
            raise
        with self._lock:
            self._sizes[self._active] += written
            self._seen.update(eid for eid, _ in records)
            self._grew.notify_all()
        if self._sizes[self._active] >= self.segment_bytes:
            self._rotate()

    # -- reading ----------------------------------------------------------------------------------------
    def read(self, position: SpoolPosition = SpoolPosition(), max_records: int = 256,
             timeout_s: float = 0.0) -> tuple[list[Trajectory], SpoolPosition]:
        """Up to `max_records` durable trajectories from `position`, and the position after them.

        Waits up to `timeout_s` for a record when none is there yet. Each record's crc32 is checked.
        Arrays of the returned trajectories are views over bytes read from disk.

        Raises:
          ProtocolError("spool"): a record that fails its crc32 (disk corruption).
        """
        with self._grew:
            if not self._has_after(position) and timeout_s > 0:
                self._grew.wait_for(lambda: self._has_after(position), timeout=timeout_s)
            sizes = dict(self._sizes)
        out: list[Trajectory] = []
        pos = position
        for seg in sorted(s for s in sizes if s >= position.segment):
            if seg > pos.segment:
                pos = SpoolPosition(seg, 0)
            if pos.offset >= sizes[seg]:
                continue
            with open(self._path(seg), "rb") as f:
                f.seek(pos.offset)
                at = pos.offset
                while at < sizes[seg] and len(out) < max_records:
                    rec = _read_record(f, sizes[seg] - at, verify=True)
                    if rec is None:
                        raise ProtocolError("spool", f"corrupt record in {self._path(seg)} at byte {at}")
                    out.append(decode(rec[1], (Trajectory,), _READ_LIMITS))
                    at += rec[2]
            pos = SpoolPosition(seg, at)
            if len(out) >= max_records:
                break
        return out, pos

    def _has_after(self, position: SpoolPosition) -> bool:
        return any(size > (position.offset if seg == position.segment else 0)
                   for seg, size in self._sizes.items() if seg >= position.segment)

    def release(self, position: SpoolPosition) -> int:
        """Delete the segments wholly before `position` (consumed by the learner); their ids move to
        `seen.log` (fsync'd) first, so duplicates are still refused after a restart. Returns segments deleted."""
        with self._lock:
            done = sorted(s for s in self._sizes if s < position.segment and s != self._active)
        if not done:
            return 0
        ids: list[str] = []
        for seg in done:
            ids += list(self._ids_in(seg))
        with open(self.dir / "seen.log", "ab") as f:
            for eid in ids:
                raw = eid.encode()
                f.write(_SEEN.pack(len(raw), crc32(raw)) + raw)
            f.flush()
            os.fsync(f.fileno())
        for seg in done:
            os.unlink(self._path(seg))
            with self._lock:
                del self._sizes[seg]
        _fsync_dir(self.dir)
        return len(done)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    # -- files ------------------------------------------------------------------------------------------
    def _path(self, seg: int) -> Path:
        return self.dir / f"seg-{seg:08d}.spool"

    def _segments(self) -> list[int]:
        return sorted(int(p.stem[4:]) for p in self.dir.glob("seg-*.spool"))

    def _new_segment(self, seg: int) -> None:
        fd = os.open(self._path(seg), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.close(fd)
        _fsync_dir(self.dir)
        with self._lock:
            self._sizes[seg] = 0
            self._active = seg

    def _rotate(self) -> None:
        os.close(self._fd)
        self._new_segment(self._active + 1)
        self._fd = os.open(self._path(self._active), os.O_WRONLY | os.O_APPEND)

    def _read_seen_log(self) -> None:
        path = self.dir / "seen.log"
        if not path.exists():
            return
        data = path.read_bytes()
        at = 0
        while at + _SEEN.size <= len(data):
            n, crc = _SEEN.unpack_from(data, at)
            raw = data[at + _SEEN.size: at + _SEEN.size + n]
            if len(raw) != n or crc32(raw) != crc:
                break
            self._seen.add(raw.decode())
            at += _SEEN.size + n
        if at != len(data):
            log.warning("spool: cutting a torn tail of %d bytes off %s", len(data) - at, path)
            with open(path, "r+b") as f:
                f.truncate(at)
                os.fsync(f.fileno())

    def _scan_segment(self, seg: int, *, verify: bool) -> int:
        """Add the ids of a segment to the seen set; returns its valid length (a torn tail is cut off)."""
        path = self._path(seg)
        size = path.stat().st_size
        at = 0
        with open(path, "rb") as f:
            while at < size:
                rec = _read_record(f, size - at, verify=verify, ids_only=not verify)
                if rec is None:
                    break
                self._seen.add(rec[0])
                at += rec[2]
        if at != size:
            log.warning("spool: cutting a torn tail of %d bytes off %s", size - at, path)
            with open(path, "r+b") as f:
                f.truncate(at)
                os.fsync(f.fileno())
        return at

    def _ids_in(self, seg: int) -> list[str]:
        ids, size = [], self._sizes[seg]
        with open(self._path(seg), "rb") as f:
            at = 0
            while at < size and (rec := _read_record(f, size - at, verify=False, ids_only=True)) is not None:
                ids.append(rec[0])
                at += rec[2]
        return ids


def _read_record(f: Any, remaining: int, *, verify: bool,
                 ids_only: bool = False) -> tuple[str, list[memoryview], int] | None:
    """Read the record at the file position: (episode id, frames, record bytes), or None when torn/corrupt
    (including a record claiming more than the `remaining` bytes of the file).

    With `ids_only` the frames are skipped (seek) and returned empty.
    """
    head = f.read(_HEAD.size + _FIXED.size)
    if len(head) < _HEAD.size + _FIXED.size:
        return None
    magic, crc = _HEAD.unpack_from(head, 0)
    body_len, id_len, nframes = _FIXED.unpack_from(head, _HEAD.size)
    if magic != _MAGIC or id_len + 8 * nframes > body_len:
        return None
    total = len(head) + body_len
    if total > remaining:
        return None
    if ids_only:
        ident = f.read(id_len)
        if len(ident) != id_len:
            return None
        f.seek(body_len - id_len, os.SEEK_CUR)
        return ident.decode(errors="replace"), [], total
    body = f.read(body_len)
    if len(body) != body_len:
        return None
    if verify and crc32(body, crc32(head[_HEAD.size:])) != crc:
        return None
    view = memoryview(body)
    lens = struct.unpack_from(f"<{nframes}Q", body, id_len)
    frames, p = [], id_len + 8 * nframes
    for n in lens:
        frames.append(view[p:p + n])
        p += n
    if p != body_len:
        return None
    return bytes(view[:id_len]).decode(errors="replace"), frames, total
