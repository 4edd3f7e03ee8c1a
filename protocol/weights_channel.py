"""Weights learner -> actors: a credit-based chunk transfer (the zguide's file-transfer pattern).

Publisher (learner side, ROUTER): `publish(version, tensors)` copies the tensors once into publisher-owned
chunks of `chunk_bytes` (each its own buffer), computes a crc32 per chunk and the manifest, and keeps the
newest `keep_versions` versions. It answers `WeightsRequest` with the newest manifest and each
`WeightsChunkRequest` with one zero-copy `WeightsChunk`. It never blocks: every send is non-blocking to a
per-peer queue of at most `2 * max_credit + 4` messages, so a slow actor only fills its own queue (a chunk
that does not fit is dropped and counted; the actor asks again). A queued frame pins only its own chunk,
so publisher memory is bounded by the kept versions plus `peers x (2 * max_credit + 4) x chunk_bytes`.

Fetcher (actor side, DEALER): asks for the newest manifest, keeps `credit` chunk requests in flight, checks
each chunk's CRC-32 against the manifest on a small thread pool while the next chunks arrive, re-requests
what times out or fails its check, and returns the tensors only when every chunk has passed. A tensor that
lies inside one chunk is a read-only view of the received ZeroMQ frame (no copy at all); a tensor spread over
several chunks is joined into its own buffer (one copy). A version retired mid-fetch ("gone") restarts the
fetch at the newest version. `recycle(update)` hands an old version's buffers back, so steady-state fetches
allocate little.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import logging
import mmap
import os
import threading
import time
import uuid
from typing import Any, Mapping

import numpy as np
import zmq

from protocol.auth import CurveClient, CurveServer
from protocol.codec import DTYPES, Limits, decode, dtype_name, encode
from protocol.errors import ProtocolError
from protocol.handshake import Error, Heartbeat, Hello
from protocol.sockets import (ClosesOnExit, RouterServer, bad_message, frame_bytes, make_socket, recv_frames, send_frames,
                              send_message)
from protocol.checksum import crc32
from protocol.weights import (WeightsChunk, WeightsChunkRequest, WeightsManifest, WeightsRequest,
                              build_manifest, plan_layout)

log = logging.getLogger(__name__)

#: What the publisher accepts: small requests only.
REQUEST_LIMITS = Limits(max_header_bytes=4096, max_str_bytes=1024, max_items=64, max_arrays=1,
                        max_array_bytes=1, max_frame_bytes=4096, max_frames=1, max_message_bytes=4096)


def fetch_limits(max_chunk_bytes: int) -> Limits:
    """What the fetcher accepts: a manifest header of up to 64 MiB and chunks of up to `max_chunk_bytes`."""
    return Limits(max_header_bytes=64 << 20, max_str_bytes=1 << 20, max_items=1 << 24, max_arrays=1,
                  max_array_bytes=max_chunk_bytes, max_frame_bytes=max_chunk_bytes, max_frames=2,
                  max_message_bytes=max_chunk_bytes + (64 << 20))


class WeightsPublisher(RouterServer):
    """Learner-side weights service.

    Args:
      endpoint: where to bind, e.g. "tcp://*:5556".
      chunk_bytes: chunk size (default 4 MiB; several in flight keep a loopback or LAN link busy).
      keep_versions: newest versions kept; an older one is answered "gone".
      max_credit: most chunk requests one actor may have outstanding (its queue's HWM is 2 * max_credit + 4).
      publisher_id: id in `Hello` answers.
      workers: threads that copy and checksum chunks in `publish` (capped at the CPU count).
      io_threads: ZeroMQ I/O threads of the publisher's context (capped at the CPU count). Each actor's
        connection is served by one I/O thread, and one thread moves about 4-4.5 GB/s of 4 MiB chunks over tcp
        loopback on the H200 host (STACK_NOTES), so one thread serving 4 actors a 0.94 GB version needs about
        0.85 s by that rate (0.90 s was measured there for the steady version, benchmarks/RESULTS.md): the
        default gives each of up to 4 actors its own thread (not measured yet).
      curve: CURVE server keys.

    Counters in `stats`: manifests_sent, chunks_sent, bytes_sent, bad_messages, dropped (a full peer
    queue), gone, not_found.
    """

    def __init__(self, endpoint: str, *, chunk_bytes: int = 4 << 20, keep_versions: int = 2, max_credit: int = 16,
                 publisher_id: str = "learner", workers: int = 8, io_threads: int = 4,
                 curve: CurveServer | None = None):
        if chunk_bytes <= 0 or keep_versions < 1 or max_credit < 1:
            raise ValueError("chunk_bytes, keep_versions and max_credit must be positive")
        self.chunk_bytes = chunk_bytes
        self.keep_versions = keep_versions
        self.publisher_id = publisher_id
        self.stats = collections.Counter({k: 0 for k in ("manifests_sent", "chunks_sent", "bytes_sent",
                                                         "bad_messages", "dropped", "gone", "not_found")})
        # version -> (manifest, chunk buffers, each chunk's encoded WeightsChunk frames)
        self._versions: dict[int, tuple[WeightsManifest, list[np.ndarray], list[list[Any]]]] = {}
        self._newest: int | None = None
        self._lock = threading.Lock()
        self._retiring: list[np.ndarray] = []  # chunk buffers of retired versions, reusable once released
        self._trackers: dict[int, list[zmq.MessageTracker]] = {}  # id(buffer) -> sends not yet released
        self._workers = concurrent.futures.ThreadPoolExecutor(max(1, min(workers, os.cpu_count() or 1)))
        # ZeroMQ learns of reads in batches of about half the HWM, so a pipe looks fuller than it is:
        # twice the credit keeps a well-behaved actor from ever seeing a drop.
        self._bind_router(endpoint, limits=REQUEST_LIMITS, curve=curve, sndhwm=2 * max_credit + 4, rcvhwm=10_000,
                          io_threads=min(io_threads, os.cpu_count() or 1))

    @property
    def newest_version(self) -> int | None:
        return self._newest

    def publish(self, version: int, tensors: Mapping[str, np.ndarray]) -> WeightsManifest:
        """Make `tensors` (name -> array, any travelling dtype, bf16 included) version `version`.

        The tensors are copied into chunk buffers (the caller may reuse its arrays at once); buffers of
        retired versions are reused once ZeroMQ has released every frame sent from them (tracked sends).
        Copy and crc32 run on `workers` threads (both release the GIL). Returns the manifest.

        Raises:
          ValueError: `version` not above the newest published one.
          ProtocolError: a dtype that cannot travel.
        """
        if self._newest is not None and version <= self._newest:
            raise ValueError(f"version {version} is not above the newest published version {self._newest}")
        arrays = {name: a if a.flags.c_contiguous else a.copy(order="C") for name, a in tensors.items()}
        for a in arrays.values():
            dtype_name(a.dtype)
        offsets, total = plan_layout(arrays)
        cb = self.chunk_bytes
        chunks = [self._take_buffer(min(cb, total - s)) for s in range(0, total, cb)]
        pieces: list[list[tuple[int, np.ndarray | None, int]]] = [[] for _ in chunks]  # (offset, source, n)

        def place(start: int, src: np.ndarray | None, n: int) -> None:
            at = 0
            while at < n:
                c, o = divmod(start + at, cb)
                k = min(n - at, len(chunks[c]) - o)
                pieces[c].append((o, None if src is None else src[at:at + k], k))
                at += k

        pos = 0
        for a, start in zip(arrays.values(), offsets):
            place(pos, None, start - pos)  # alignment padding: zeros
            place(start, a.reshape(-1).view(np.uint8), a.nbytes)
            pos = start + a.nbytes

        def fill(c: int) -> int:
            buf = chunks[c]
            for o, src, k in pieces[c]:
                if src is None:
                    buf[o:o + k] = 0
                else:
                    buf[o:o + k] = src
            return crc32(buf)

        crcs = list(self._workers.map(fill, range(len(chunks))))
        manifest = build_manifest(version, arrays, offsets, total, cb, crcs)
        frames = [encode(WeightsChunk(version=version, index=i, data=c)) for i, c in enumerate(chunks)]
        with self._lock:
            self._versions[version] = (manifest, chunks, frames)
            for old in sorted(self._versions)[:-self.keep_versions]:
                self._retiring.extend(self._versions.pop(old)[1])
            # keep at most one version's worth of full-size buffers for reuse; let the rest go
            self._retiring = [b for b in self._retiring if len(b) == cb][-len(chunks):]
            kept = {id(b) for b in self._retiring} | {id(b) for _, bufs, _ in self._versions.values() for b in bufs}
            self._trackers = {k: v for k, v in self._trackers.items() if k in kept}
            self._newest = version
        return manifest

    def _take_buffer(self, nbytes: int) -> np.ndarray:
        """A chunk buffer: a released one of a retired version when possible, else a new one."""
        if nbytes == self.chunk_bytes:
            with self._lock:
                for i, buf in enumerate(self._retiring):
                    if all(t.done for t in self._trackers.get(id(buf), ())):
                        self._trackers.pop(id(buf), None)
                        return self._retiring.pop(i)
        return alloc_buffer(nbytes)

    def start(self) -> "WeightsPublisher":
        self._thread = threading.Thread(target=self.serve, name="weights-publisher", daemon=True)
        self._thread.start()
        return self

    def serve(self) -> None:
        """Serve until `close()` (blocking)."""
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        while not self._stop.is_set():
            if not poller.poll(100):
                continue
            for _ in range(256):
                try:
                    frames = recv_frames(self._sock, limits=REQUEST_LIMITS, envelope=1, flags=zmq.NOBLOCK)
                except zmq.Again:
                    break
                except ProtocolError as e:
                    self._bad(e.envelope[:1], e)
                    continue
                peer = frames[0].bytes
                try:
                    msg = decode(frames[1:], (WeightsChunkRequest, WeightsRequest, Hello, Heartbeat), REQUEST_LIMITS)
                except ProtocolError as e:
                    self._bad([peer], e)
                    continue
                self._answer(peer, msg)

    def _answer(self, peer: bytes, msg: Any) -> None:
        if isinstance(msg, WeightsChunkRequest):
            entry = self._versions.get(msg.version)
            if entry is None:
                self.stats["gone"] += 1
                self._send(peer, Error(code="gone", request_id=str(msg.version),
                                       message=f"version {msg.version} is not kept; newest is {self._newest}"))
            elif msg.index >= len(entry[1]):
                self.stats["bad_messages"] += 1
                self._send(peer, Error(code="bad_message", field="WeightsChunkRequest.index",
                                       message=f"version {msg.version} has {len(entry[1])} chunks"))
            elif self._send(peer, entry[2][msg.index], track=entry[1][msg.index]):
                self.stats["chunks_sent"] += 1
                self.stats["bytes_sent"] += len(entry[1][msg.index])
        elif isinstance(msg, WeightsRequest):
            newest = self._versions.get(self._newest) if self._newest is not None else None
            if newest is None:
                self.stats["not_found"] += 1
                self._send(peer, Error(code="not_found", message="no weights published yet"))
            elif self._send(peer, newest[0]):
                self.stats["manifests_sent"] += 1
        elif isinstance(msg, Heartbeat):
            self._send(peer, Heartbeat(id=self.publisher_id, seq=msg.seq, time_s=time.time()))
        else:
            self._send(peer, Hello(role="publisher", id=self.publisher_id))

    def _send(self, peer: bytes, msg: Any, track: np.ndarray | None = None) -> bool:
        """Send a message (or its encoded frames) without blocking; with `track`, remember the send's tracker
        for that chunk buffer."""
        frames = msg if isinstance(msg, list) else encode(msg)
        try:
            tracker = send_frames(self._sock, frames, envelope=[peer], flags=zmq.NOBLOCK, track=track is not None)
        except (zmq.Again, zmq.ZMQError):  # that peer's queue is full (or it left): never wait for it
            self.stats["dropped"] += 1
            return False
        if track is not None and tracker is not None:
            with self._lock:
                live = [t for t in self._trackers.get(id(track), ()) if not t.done]
                self._trackers[id(track)] = live + [tracker]
        return True

    def _bad(self, envelope: list[Any], err: ProtocolError) -> None:
        self.stats["bad_messages"] += 1
        log.warning("weights publisher: bad message: %s", err)
        if envelope:
            self._send(frame_bytes(envelope[0]), bad_message(err))

    def _release(self) -> None:
        self._workers.shutdown()


@dataclasses.dataclass(frozen=True, eq=False)
class WeightsUpdate:
    """A verified weights version: its manifest and name -> read-only array. A tensor that lies inside one
    chunk is a view of the received ZeroMQ frame (no copy); a tensor spread over several chunks is joined
    into its own buffer (`buffers`). Hand the update to `WeightsFetcher.recycle` once its tensors are no
    longer used, so the next fetch reuses those buffers."""

    manifest: WeightsManifest
    tensors: dict[str, np.ndarray]
    buffers: tuple[np.ndarray, ...] = ()  # uint8 buffers this update owns (joined tensors)

    @property
    def version(self) -> int:
        return self.manifest.version


def alloc_buffer(nbytes: int) -> np.ndarray:
    """A writable uint8 [nbytes] buffer of fresh anonymous memory, its pages mapped up front (MAP_POPULATE).

    Used instead of `np.empty` for large buffers: NumPy asks for transparent huge pages on allocations of
    4 MiB and more, and where the kernel compacts memory synchronously to provide them (THP defrag
    "madvise") that first touch measured 5-10x slower than populating 4 KiB pages in one call.
    """
    if nbytes <= 0:
        return np.empty(0, dtype=np.uint8)
    flags = getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0) | getattr(mmap, "MAP_POPULATE", 0)
    try:
        return np.frombuffer(mmap.mmap(-1, nbytes, flags=flags) if flags else mmap.mmap(-1, nbytes), dtype=np.uint8)
    except (OSError, ValueError):
        return np.empty(nbytes, dtype=np.uint8)


@dataclasses.dataclass
class _Plan:
    """Where each tensor of a manifest comes from: one chunk (zero-copy view) or pieces of several."""

    home: dict[int, tuple[int, int]]                         # tensor -> (chunk, offset in chunk) when inside one
    pieces: list[list[tuple[int, int, int, int]]]            # chunk -> [(tensor, tensor offset, chunk offset, n)]
    keep: set[int]                                           # chunks whose frame backs a zero-copy tensor

    @classmethod
    def of(cls, m: WeightsManifest) -> "_Plan":
        home, keep = {}, set()
        pieces: list[list[tuple[int, int, int, int]]] = [[] for _ in range(m.num_chunks)]
        for t in range(len(m.names)):
            start, n = m.offsets[t], m.tensor_bytes(t)
            if n == 0:
                continue
            first, last = start // m.chunk_bytes, (start + n - 1) // m.chunk_bytes
            if first == last:
                home[t] = (first, start - first * m.chunk_bytes)
                keep.add(first)
                continue
            at = 0
            while at < n:
                c, o = divmod(start + at, m.chunk_bytes)
                k = min(n - at, m.chunk_range(c)[1] - m.chunk_range(c)[0] - o)
                pieces[c].append((t, at, o, k))
                at += k
        return cls(home, pieces, keep)


def _check_and_place(data: np.ndarray, expected_len: int, crc: int, pieces: list[tuple[int, int, int, int]],
                     joined: dict[int, np.ndarray]) -> bool:
    """Check a chunk's length and CRC-32, then copy its pieces of multi-chunk tensors into place (the CRC
    and numpy's copy release the GIL, so this runs on the pool while the next chunks arrive)."""
    if len(data) != expected_len or crc32(data) != crc:
        return False
    for t, t_off, c_off, n in pieces:
        joined[t][t_off:t_off + n] = data[c_off:c_off + n]
    return True


class WeightsFetcher(ClosesOnExit):
    """Actor-side weights client (synchronous; one fetch at a time).

    Args:
      endpoint: the publisher, e.g. "tcp://learner:5556".
      actor_id: this actor's id.
      credit: chunk requests kept in flight (at most the publisher's max_credit).
      timeout_s: a fetch re-requests its outstanding chunks after this long without a reply, and fails
        after three such rounds in a row.
      max_chunk_bytes: largest chunk accepted (also the socket's ZMQ_MAXMSGSIZE).
      max_total_bytes: largest version accepted (memory bound).
      verify_workers: threads that check CRC-32s and join chunks while the next ones arrive (0: do it in
        the calling thread).
      curve: CURVE client keys.

    Counters in `stats`: fetches, chunks, bytes, crc_failures, rerequests, restarts, bad_replies.
    """

    def __init__(self, endpoint: str, *, actor_id: str = "actor", credit: int = 8, timeout_s: float = 10.0,
                 max_chunk_bytes: int = 64 << 20, max_total_bytes: int = 1 << 40, verify_workers: int = 2,
                 curve: CurveClient | None = None):
        self.actor_id = actor_id
        self.credit = credit
        self.timeout_s = timeout_s
        self.max_total_bytes = max_total_bytes
        self._spare: dict[int, list[np.ndarray]] = {}  # recycled buffers by size
        self._pool = (concurrent.futures.ThreadPoolExecutor(verify_workers, thread_name_prefix="weights-check")
                      if verify_workers > 0 else None)
        self.limits = fetch_limits(max_chunk_bytes)
        self.stats = collections.Counter({k: 0 for k in ("fetches", "chunks", "bytes", "crc_failures",
                                                         "rerequests", "restarts", "bad_replies")})
        self._ctx = zmq.Context()
        self._sock = make_socket(self._ctx, zmq.DEALER, limits=self.limits, curve=curve,
                                 sndhwm=credit + 16, rcvhwm=credit + 4,
                                 identity=f"{actor_id}-{uuid.uuid4().hex[:8]}".encode())
        self._sock.connect(endpoint)
        self._abandoned = threading.Event()

    def abandon(self) -> None:
        """Make a fetch in progress (in another thread) give up within 0.1 s, as if the publisher did not answer,
        and every later one at once: the caller is going away (e.g. an aborted actor, whose exit would otherwise
        wait out `timeout_s` for a publisher that has already gone)."""
        self._abandoned.set()

    def recycle(self, update: WeightsUpdate) -> None:
        """The caller no longer uses `update`'s tensors: their buffers may be overwritten by the next fetch."""
        for buf in update.buffers:
            self._spare.setdefault(buf.nbytes, []).append(buf)

    def newest_manifest(self, timeout_s: float | None = None) -> WeightsManifest | None:
        """The publisher's newest manifest, or None when nothing is published yet.

        Raises TimeoutError when the publisher does not answer within `timeout_s` (default: `self.timeout_s`).
        """
        send_message(self._sock, WeightsRequest(actor_id=self.actor_id))
        deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
        while True:
            msg = self._recv(deadline)
            if msg is None:
                raise TimeoutError(f"no manifest from the publisher within {timeout_s or self.timeout_s} s")
            if isinstance(msg, WeightsManifest):
                return msg
            if isinstance(msg, Error) and msg.code == "not_found":
                return None
            # a stale chunk or error from an earlier fetch: ignore

    def fetch(self, known_version: int = -1, timeout_s: float | None = None) -> WeightsUpdate | None:
        """Fetch the newest version if it is newer than `known_version`; None when there is nothing newer.

        Raises:
          TimeoutError: no progress for three `timeout_s` rounds (default `self.timeout_s`).
          ProtocolError: the version is larger than `max_total_bytes`, or repeated crc32 failures.
        """
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        for _ in range(8):
            manifest = self.newest_manifest(timeout_s)
            if manifest is None or manifest.version <= known_version:
                return None
            update = self._pull(manifest, timeout_s)
            if update is not None:
                self.stats["fetches"] += 1
                return update
            self.stats["restarts"] += 1
        raise TimeoutError("weights kept being retired while fetching; is the publisher publishing too fast?")

    def _pull(self, manifest: WeightsManifest, timeout_s: float) -> WeightsUpdate | None:
        """Every chunk of `manifest`, checked, as a WeightsUpdate; None when the version is gone."""
        if manifest.total_bytes > self.max_total_bytes:
            raise ProtocolError("WeightsManifest.total_bytes",
                                f"{manifest.total_bytes} bytes exceeds this fetcher's {self.max_total_bytes}")
        if manifest.chunk_bytes > self.limits.max_frame_bytes:
            raise ProtocolError("WeightsManifest.chunk_bytes",
                                f"{manifest.chunk_bytes} bytes exceeds this fetcher's {self.limits.max_frame_bytes}")
        plan = _Plan.of(manifest)
        joined: dict[int, np.ndarray] = {}
        for t in range(len(manifest.names)):
            if t not in plan.home and manifest.tensor_bytes(t):
                n = manifest.tensor_bytes(t)
                spare = self._spare.get(n)
                joined[t] = spare.pop() if spare else alloc_buffer(n)
        kept: dict[int, np.ndarray] = {}  # chunk -> received data backing zero-copy tensors
        todo = collections.deque(range(manifest.num_chunks))
        outstanding: dict[int, None] = {}  # requested, in request order (replies come back in that order)
        checking: dict[concurrent.futures.Future, int] = {}  # received, crc32 + copy running on the pool
        crc_failures = 0
        idle_rounds = 0

        def request_more() -> None:
            while todo and len(outstanding) < self.credit:
                index = todo.popleft()
                send_message(self._sock, WeightsChunkRequest(version=manifest.version, index=index))
                outstanding[index] = None

        def harvest(block: bool) -> None:
            nonlocal crc_failures
            if not checking:
                return
            done, _ = concurrent.futures.wait(list(checking), timeout=None if block else 0,
                                              return_when=concurrent.futures.FIRST_COMPLETED)
            for fut in done:
                index = checking.pop(fut)
                if fut.result():
                    self.stats["chunks"] += 1
                    self.stats["bytes"] += manifest.chunk_range(index)[1] - manifest.chunk_range(index)[0]
                    continue
                kept.pop(index, None)
                crc_failures += 1
                self.stats["crc_failures"] += 1
                if crc_failures > 3 * self.credit:
                    raise ProtocolError("WeightsChunk.data", f"{crc_failures} chunks failed their crc32")
                todo.appendleft(index)

        while todo or outstanding or checking:
            harvest(block=False)
            request_more()
            if not outstanding:
                harvest(block=True)  # only checks left (or a failed one to fetch again)
                continue
            if len(checking) >= 2 * self.credit:
                harvest(block=True)  # bound the received-but-unchecked chunks held in memory
            msg = self._recv(time.monotonic() + timeout_s)
            if msg is None:  # lost requests or replies (publisher restarted, queue full): ask again
                idle_rounds += 1
                if idle_rounds >= 3:
                    raise TimeoutError(f"weights v{manifest.version}: no chunk for {3 * timeout_s:.0f} s")
                self.stats["rerequests"] += len(outstanding)
                todo.extendleft(sorted(outstanding, reverse=True))
                outstanding.clear()
                continue
            idle_rounds = 0
            if isinstance(msg, Error):
                if msg.code == "gone" and msg.request_id == str(manifest.version):
                    concurrent.futures.wait(list(checking))
                    for t, buf in joined.items():  # keep the buffers for the retry
                        self._spare.setdefault(buf.nbytes, []).append(buf)
                    return None
                continue
            if not isinstance(msg, WeightsChunk) or msg.version != manifest.version or msg.index not in outstanding:
                continue  # stale reply of an earlier fetch or a re-requested duplicate
            for earlier in list(outstanding):  # requested before this one yet unanswered: dropped on the way
                if earlier == msg.index:
                    break
                del outstanding[earlier]
                todo.appendleft(earlier)
                self.stats["rerequests"] += 1
            del outstanding[msg.index]
            request_more()  # keep the window full while this chunk is checked and copied
            start, stop = manifest.chunk_range(msg.index)
            if msg.index in plan.keep:
                kept[msg.index] = msg.data
            args = (msg.data, stop - start, manifest.chunk_crc32[msg.index], plan.pieces[msg.index], joined)
            if self._pool is None:  # check in this thread
                fut: concurrent.futures.Future = concurrent.futures.Future()
                fut.set_result(_check_and_place(*args))
            else:
                fut = self._pool.submit(_check_and_place, *args)
            checking[fut] = msg.index
        tensors = {}
        for t, name in enumerate(manifest.names):
            dtype, shape = DTYPES[manifest.dtypes[t]], manifest.shapes[t]
            if t in plan.home:
                c, o = plan.home[t]
                raw = kept[c][o:o + manifest.tensor_bytes(t)]
            elif t in joined:
                raw = joined[t][:]
                raw.flags.writeable = False
            else:
                raw = np.empty(0, np.uint8)
            tensors[name] = raw.view(dtype).reshape(shape)
        return WeightsUpdate(manifest, tensors, tuple(joined.values()))

    def _recv(self, deadline: float) -> Any | None:
        """Next decodable reply before `deadline`, or None at the deadline (bad replies are counted)."""
        while True:
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0 or self._abandoned.is_set():
                return None
            if not self._sock.poll(min(left_ms, 100), zmq.POLLIN):
                continue
            try:
                frames = recv_frames(self._sock, limits=self.limits)
                return decode(frames, (WeightsChunk, WeightsManifest, Error, Heartbeat, Hello), self.limits)
            except ProtocolError as e:
                self.stats["bad_replies"] += 1
                log.warning("weights fetcher %s: bad reply: %s", self.actor_id, e)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
        self._sock.close(0)
        self._ctx.term()
