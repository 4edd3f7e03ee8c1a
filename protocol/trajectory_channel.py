"""Trajectories actor -> learner with acknowledgement (ROUTER on the learner, DEALER on each actor).

Learner side, `TrajectoryReceiver`: drains what has arrived (up to `max_batch`), drops episode ids it has
seen, appends the rest to the `TrajectorySpool` with one fdatasync, and only then acks each trajectory
("stored" or "duplicate"). A SIGKILL between receipt and ack loses nothing: the actor still holds the
trajectory and resends it; if it was already durable, the resend is acked as "duplicate" and not stored twice.

Actor side, `TrajectoryOutbox`: keeps every trajectory until acked, sends at most `window` unacked ones at a
time, resends any unacked one after `resend_after_s`, and blocks `put` while `max_pending` are held (memory
bound). A trajectory the learner refuses with an `Error` naming its episode id is dropped and counted.

Wire: actor -> learner frames = a `Trajectory` (or `Hello` / `Heartbeat`); learner -> actor = a
`TrajectoryAck`, an `Error`, or the `Hello` / `Heartbeat` answer.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from pathlib import Path
from typing import Any, Callable

import msgpack
import zmq

from protocol.auth import CurveClient, CurveServer
from protocol.codec import Limits, decode, encode
from protocol.errors import ProtocolError
from protocol.handshake import Error, Heartbeat, Hello
from protocol.sockets import (ClosesOnExit, RouterServer, WakePipe, bad_message, frame_bytes, hwm_for, make_socket,
                              recv_frames, send_message)
from protocol.spool import TrajectorySpool
from protocol.trajectory import Trajectory, TrajectoryAck

log = logging.getLogger(__name__)

#: Bounds on what the learner accepts: 1 MiB header, arrays up to 64 MiB (16M tokens of int32).
TRAJECTORY_LIMITS = Limits(max_header_bytes=1 << 20, max_str_bytes=256 << 10, max_items=4096, max_arrays=4,
                           max_array_bytes=64 << 20, max_frame_bytes=64 << 20, max_frames=5,
                           max_message_bytes=200 << 20)
#: Bounds on the learner's replies as the actor reads them.
REPLY_LIMITS = Limits(max_header_bytes=64 << 10, max_str_bytes=8 << 10, max_items=256, max_arrays=1,
                      max_array_bytes=1, max_frame_bytes=64 << 10, max_frames=1, max_message_bytes=64 << 10)


class TrajectoryReceiver(RouterServer):
    """Learner-side end of the acked trajectory channel.

    Args:
      endpoint: where to bind, e.g. "tcp://*:5555".
      spool: the durable spool (or its folder) trajectories go to; readers use `spool.read`.
      learner_id: id in `Hello` answers.
      max_batch: most trajectories per fdatasync.
      queue_bytes: receive queue bound in bytes (the HWM is derived from it and the frame limit).
      limits: bounds on incoming messages.
      curve: CURVE server keys; with them only authorised actors get through.
      on_stored: called in the receiver thread with the episode ids just made durable, before they are
        acked (e.g. to wake the learner's buffer); it must not block for long.

    Counters in `stats`: received, stored, duplicates, bad_messages, acks_dropped, batches, store_errors.
    """

    def __init__(self, endpoint: str, spool: TrajectorySpool | str | Path, *, learner_id: str = "learner",
                 max_batch: int = 256, queue_bytes: int = 512 << 20, limits: Limits = TRAJECTORY_LIMITS,
                 curve: CurveServer | None = None, on_stored: Callable[[list[str]], None] | None = None):
        self.on_stored = on_stored
        self.spool = spool if isinstance(spool, TrajectorySpool) else TrajectorySpool(spool)
        self.learner_id = learner_id
        self.max_batch = max_batch
        self.limits = limits
        self.stats = collections.Counter({k: 0 for k in ("received", "stored", "duplicates", "bad_messages",
                                                         "acks_dropped", "batches", "store_errors")})
        self._bind_router(endpoint, limits=limits, curve=curve, sndhwm=10_000,
                          rcvhwm=hwm_for(queue_bytes, limits.max_message_bytes, minimum=16))

    def start(self) -> "TrajectoryReceiver":
        """Serve in a background thread."""
        self._thread = threading.Thread(target=self.serve, name="trajectory-receiver", daemon=True)
        self._thread.start()
        return self

    def serve(self) -> None:
        """Serve until `close()` (blocking)."""
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        while not self._stop.is_set():
            if poller.poll(100):
                self._serve_batch()

    def _serve_batch(self) -> None:
        batch: list[tuple[bytes, Trajectory, list[zmq.Frame]]] = []
        while len(batch) < self.max_batch:
            try:
                frames = recv_frames(self._sock, limits=self.limits, envelope=1, flags=zmq.NOBLOCK)
            except zmq.Again:
                break
            except ProtocolError as e:
                self._bad(e.envelope[:1], e)
                continue
            peer = frames[0].bytes
            try:
                msg = decode(frames[1:], (Trajectory, Hello, Heartbeat), self.limits)
            except ProtocolError as e:
                self._bad([peer], e, _episode_id_of(frames[1], self.limits) if len(frames) > 1 else "")
                continue
            if isinstance(msg, Trajectory):
                self.stats["received"] += 1
                batch.append((peer, msg, frames[1:]))
            elif isinstance(msg, Heartbeat):
                self._reply(peer, Heartbeat(id=self.learner_id, seq=msg.seq, time_s=time.time()))
            else:
                self._reply(peer, Hello(role="learner", id=self.learner_id))
        if not batch:
            return
        fresh, fresh_ids = [], set()
        for peer, traj, frames in batch:
            if traj.episode_id not in fresh_ids and traj.episode_id not in self.spool:
                fresh_ids.add(traj.episode_id)
                fresh.append((traj.episode_id, [f.buffer for f in frames]))
        try:
            self.spool.append(fresh)  # durable (fdatasync) before any ack below
        except OSError as e:  # disk full or failing: ack nothing, the actors resend later
            self.stats["store_errors"] += 1
            log.error("trajectory receiver: could not store %d trajectories: %s", len(fresh), e)
            return
        self.stats["batches"] += 1
        self.stats["stored"] += len(fresh)
        if self.on_stored is not None and fresh:
            self.on_stored([eid for eid, _ in fresh])
        for peer, traj, _ in batch:
            status = "stored" if traj.episode_id in fresh_ids else "duplicate"
            fresh_ids.discard(traj.episode_id)  # a second copy in the same batch is a duplicate
            if status == "duplicate":
                self.stats["duplicates"] += 1
            self._reply(peer, TrajectoryAck(episode_id=traj.episode_id, status=status))

    def _bad(self, envelope: list[Any], err: ProtocolError, episode_id: str = "") -> None:
        self.stats["bad_messages"] += 1
        log.warning("trajectory receiver: bad message: %s", err)
        if envelope:
            self._reply(frame_bytes(envelope[0]), bad_message(err, request_id=episode_id))

    def _reply(self, peer: bytes, msg: Any) -> None:
        try:
            send_message(self._sock, msg, envelope=[peer], flags=zmq.NOBLOCK)
        except (zmq.Again, zmq.ZMQError):  # peer gone or its queue full: it will resend
            self.stats["acks_dropped"] += 1

    def _release(self) -> None:
        self.spool.close()


def _episode_id_of(header: zmq.Frame, limits: Limits) -> str:
    """Best effort: the episode id in a refused Trajectory's header, so the actor can drop it ("" if none)."""
    try:
        if len(header) > limits.max_header_bytes:
            return ""
        h = msgpack.unpackb(header.buffer, max_str_len=limits.max_str_bytes, max_bin_len=0, max_ext_len=0,
                            max_array_len=limits.max_items, max_map_len=limits.max_items, strict_map_key=False)
        eid = h["body"]["episode_id"] if h.get("type") == "Trajectory" else ""
        return eid if isinstance(eid, str) and 0 < len(eid) <= 256 else ""
    except Exception:
        return ""


class _Item:
    __slots__ = ("frames", "sent_at", "sends")

    def __init__(self, frames: list[Any]):
        self.frames = frames
        self.sent_at = 0.0
        self.sends = 0


class TrajectoryOutbox(ClosesOnExit):
    """Actor-side end of the acked trajectory channel (a background thread owns the socket).

    Args:
      endpoint: the learner's receiver, e.g. "tcp://learner:5555".
      actor_id: this actor's id (for logs).
      window: most unacked trajectories on the wire at once.
      max_pending: most trajectories held (sent or not); `put` blocks beyond it.
      resend_after_s: resend a trajectory not acked after this many seconds.
      curve: CURVE client keys.

    Counters in `stats`: put, sent, resent, acked, duplicates, rejected, bad_replies.
    """

    def __init__(self, endpoint: str, *, actor_id: str = "actor", window: int = 64, max_pending: int = 1024,
                 resend_after_s: float = 2.0, curve: CurveClient | None = None):
        if not 1 <= window <= max_pending:
            raise ValueError(f"need 1 <= window ({window}) <= max_pending ({max_pending})")
        self.actor_id = actor_id
        self.window = window
        self.max_pending = max_pending
        self.resend_after_s = resend_after_s
        self.stats = collections.Counter({k: 0 for k in ("put", "sent", "resent", "acked", "duplicates",
                                                         "rejected", "bad_replies")})
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._unsent: collections.OrderedDict[str, _Item] = collections.OrderedDict()
        self._in_flight: collections.OrderedDict[str, _Item] = collections.OrderedDict()  # by send time
        self._ctx = zmq.Context()
        self._sock = make_socket(self._ctx, zmq.DEALER, limits=REPLY_LIMITS, curve=curve,
                                 sndhwm=window + 16, rcvhwm=hwm_for(64 << 20, 64 << 10))
        self._sock.immediate = True  # no queueing towards a learner that is not connected: resend later
        self._sock.connect(endpoint)
        self._wakeup = WakePipe(self._ctx, "outbox")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"outbox-{actor_id}", daemon=True)
        self._thread.start()

    @property
    def pending(self) -> int:
        """Trajectories held: not yet acked."""
        with self._lock:
            return len(self._unsent) + len(self._in_flight)

    def put(self, traj: Trajectory, timeout_s: float | None = None) -> None:
        """Hand over a trajectory; returns once it is queued (blocks while `max_pending` are held).

        The arrays are copied, so the caller may reuse them. A trajectory whose episode id is already held
        is ignored. Raises TimeoutError when no room frees up within `timeout_s`.
        """
        frames = [bytes(f) if i else f for i, f in enumerate(encode(traj))]
        with self._changed:
            if not self._changed.wait_for(lambda: len(self._unsent) + len(self._in_flight) < self.max_pending,
                                          timeout=timeout_s):
                raise TimeoutError(f"outbox full ({self.max_pending} trajectories unacked)")
            if traj.episode_id in self._unsent or traj.episode_id in self._in_flight:
                return
            self._unsent[traj.episode_id] = _Item(frames)
            self.stats["put"] += 1
        self._wake()

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until every trajectory is acked; False on timeout."""
        with self._changed:
            return self._changed.wait_for(lambda: not self._unsent and not self._in_flight, timeout=timeout_s)

    def _wake(self) -> None:
        self._wakeup.wake()

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self._wakeup.rx, zmq.POLLIN)
        while not self._stop.is_set():
            timeout_ms = self._next_timer_ms()
            events = dict(poller.poll(timeout_ms))
            if self._wakeup.rx in events:
                self._wakeup.drain()
            if self._sock in events:
                self._read_replies()
            self._send_due()

    def _next_timer_ms(self) -> int:
        with self._lock:
            if self._unsent and len(self._in_flight) < self.window:
                return 50  # could not send for lack of a connection: retry soon
            if not self._in_flight:
                return 1000
            oldest = next(iter(self._in_flight.values()))
        return max(1, int((oldest.sent_at + self.resend_after_s - time.monotonic()) * 1000) + 1)

    def _read_replies(self) -> None:
        while True:
            try:
                frames = recv_frames(self._sock, limits=REPLY_LIMITS, flags=zmq.NOBLOCK)
                msg = decode(frames, (TrajectoryAck, Error, Heartbeat, Hello), REPLY_LIMITS)
            except zmq.Again:
                return
            except ProtocolError as e:
                self.stats["bad_replies"] += 1
                log.warning("outbox %s: bad reply from the learner: %s", self.actor_id, e)
                continue
            if isinstance(msg, TrajectoryAck):
                self._forget(msg.episode_id, "duplicates" if msg.status == "duplicate" else None)
            elif isinstance(msg, Error):
                log.warning("outbox %s: learner refused %r: %s %s", self.actor_id, msg.request_id, msg.code, msg.message)
                if msg.request_id and msg.code == "bad_message":  # resending cannot help; other errors: resend
                    self._forget(msg.request_id, "rejected")

    def _forget(self, episode_id: str, counter: str | None) -> None:
        with self._changed:
            item = self._in_flight.pop(episode_id, None) or self._unsent.pop(episode_id, None)
            if item is None:
                return  # a late second ack
            self.stats["acked" if counter != "rejected" else "rejected"] += 1
            if counter == "duplicates":
                self.stats["duplicates"] += 1
            self._changed.notify_all()

    def _send_due(self) -> None:
        now = time.monotonic()
        with self._lock:
            due = []
            for eid, item in self._in_flight.items():
                if item.sent_at + self.resend_after_s > now:
                    break
                due.append(eid)
            room = self.window - len(self._in_flight)
            due += list(self._unsent)[:max(0, room)]
        for eid in due:
            with self._lock:
                item = self._in_flight.get(eid) or self._unsent.get(eid)
            if item is None:
                continue
            try:
                self._sock.send_multipart(item.frames, flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                with self._lock:  # learner not connected or queue full: try again later
                    if eid in self._in_flight:
                        self._in_flight.move_to_end(eid)
                        item.sent_at = time.monotonic()
                return
            with self._lock:
                item.sent_at = time.monotonic()
                item.sends += 1
                self.stats["resent" if item.sends > 1 else "sent"] += 1
                if eid in self._unsent:
                    del self._unsent[eid]
                    self._in_flight[eid] = item
                elif eid in self._in_flight:
                    self._in_flight.move_to_end(eid)

    def close(self) -> None:
        """Stop the thread and close the socket; unacked trajectories are dropped (flush first)."""
        self._stop.set()
        self._wake()
        self._thread.join()
        self._sock.close(0)
        self._wakeup.close()
        self._ctx.term()
