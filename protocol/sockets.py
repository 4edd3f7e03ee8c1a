"""Socket set-up and framed send/receive shared by every ZeroMQ pattern in this package.

- `make_socket`: LINGER 0, ZMQ_MAXMSGSIZE from the `Limits`, high-water marks from a byte budget (HWMs
  count messages, so a queue is bounded in bytes only when the HWM is derived from the message size), and
  CURVE when configured.
- `send_message`: frames sent with `copy=False`; with `track=True` every frame is tracked (pyzmq's
  `send_multipart` would track only the last), so a caller that reuses a buffer can wait for ZeroMQ.
- `recv_message`: reads frame by frame and stops keeping frames past the limits (the rest of the message is
  drained and dropped), so an oversized multipart message cannot exhaust memory.
- `RouterServer`: the life cycle every bound ROUTER service here shares (own context, optional CURVE
  authenticator, the bound socket, a stop event, the serving thread, `close()` in order); `bad_message` builds
  the `Error` such a service answers a malformed message with; `WakePipe` wakes a socket-owning thread.
"""

from __future__ import annotations

import threading
from typing import Any, Sequence, TypeVar

import zmq

from protocol.auth import CurveClient, CurveServer
from protocol.codec import SPLIT_BYTES, Limits, decode, encode
from protocol.errors import ProtocolError
from protocol.handshake import Error
from protocol.message import Message

M = TypeVar("M", bound=Message)


def hwm_for(budget_bytes: int, message_bytes: int, *, minimum: int = 2) -> int:
    """High-water mark (messages) that keeps a queue of `message_bytes`-sized messages under `budget_bytes`."""
    return max(minimum, budget_bytes // max(1, message_bytes))


def make_socket(ctx: zmq.Context, kind: int, *, limits: Limits, sndhwm: int, rcvhwm: int,
                curve: CurveServer | CurveClient | None = None, identity: bytes | None = None) -> zmq.Socket:
    """A socket of `kind` with bounded queues and message size; CURVE applied when given (before bind/connect)."""
    sock = ctx.socket(kind)
    sock.linger = 0
    sock.maxmsgsize = limits.zmq_maxmsgsize
    sock.sndhwm = sndhwm
    sock.rcvhwm = rcvhwm
    if identity is not None:
        sock.identity = identity
    if kind == zmq.ROUTER:
        sock.router_mandatory = True  # unroutable or full peer -> EAGAIN / EHOSTUNREACH, never a silent drop
    if curve is not None:
        curve.apply(sock)
    return sock


def send_message(sock: zmq.Socket, msg: Message, *, envelope: Sequence[Any] = (), flags: int = 0,
                 track: bool = False, split_bytes: int = SPLIT_BYTES) -> zmq.MessageTracker | None:
    """Send `envelope` frames then `msg` (header + array frames, zero-copy).

    Returns a tracker covering every frame when `track`, else None. Raises zmq.Again under zmq.NOBLOCK
    when the peer's queue is full (nothing of the message is sent then: ZeroMQ queues multipart messages
    atomically).
    """
    return send_frames(sock, encode(msg, split_bytes=split_bytes), envelope=envelope, flags=flags, track=track)


def send_frames(sock: zmq.Socket, message_frames: Sequence[Any], *, envelope: Sequence[Any] = (), flags: int = 0,
                track: bool = False) -> zmq.MessageTracker | None:
    """Send `envelope` then already encoded frames (from `protocol.codec.encode`), as `send_message` does."""
    frames = [*envelope, *message_frames]
    trackers = []
    last = len(frames) - 1
    for i, frame in enumerate(frames):
        out = sock.send(frame, flags | (zmq.SNDMORE if i < last else 0), copy=False, track=track)
        if track and isinstance(out, zmq.MessageTracker):
            trackers.append(out)
    return zmq.MessageTracker(*trackers) if track else None


def recv_frames(sock: zmq.Socket, *, limits: Limits, envelope: int = 0, flags: int = 0) -> list[zmq.Frame]:
    """All frames of one multipart message (`envelope` leading routing frames allowed beyond the limits).

    Raises:
      ProtocolError("frames"): more frames or bytes than the limits allow; the message has been consumed
        and the error's `envelope` holds its routing frames.
    """
    frames: list[zmq.Frame] = []
    total = 0
    problem = ""
    max_frames = limits.max_frames + envelope
    while True:
        frame = sock.recv(flags, copy=False)
        flags &= ~zmq.NOBLOCK  # the rest of a multipart message is already there
        more = frame.more
        if not problem:
            total += len(frame) if len(frames) >= envelope else 0
            if len(frames) >= max_frames:
                problem = f"more than {limits.max_frames} frames"
            elif total > limits.max_message_bytes:
                problem = f"more than {limits.max_message_bytes} bytes"
            else:
                frames.append(frame)
        if not more:
            break
    if problem:
        err = ProtocolError("frames", problem)
        err.envelope = frames[:envelope]
        raise err
    return frames


def recv_message(sock: zmq.Socket, expect: Sequence[type[M]], *, limits: Limits, flags: int = 0) -> M:
    """Receive and decode one message of a class in `expect` (no envelope). Raises ProtocolError."""
    return decode(recv_frames(sock, limits=limits, flags=flags), expect, limits)


def bad_message(err: ProtocolError, request_id: str = "") -> Error:
    """The `Error` a service answers a malformed message with: code "bad_message", the field and the message
    bounded (512 and 4096 characters) so that a reply never grows with the garbage it answers."""
    return Error(code="bad_message", field=err.field[:512], message=str(err)[:4096], request_id=request_id)


def frame_bytes(frame: Any) -> bytes:
    """The bytes of a received frame (a `zmq.Frame` or bytes already)."""
    return frame.bytes if isinstance(frame, zmq.Frame) else frame


class WakePipe:
    """An inproc PUSH -> PULL pair by which any thread wakes the thread that owns a context's sockets.

    `wake()` is thread-safe and never blocks (one queued wake-up is enough, so the PUSH side's HWM is 1); the
    owning thread polls `rx` and calls `drain()` when it fires. `close()` closes both ends (before the
    context's `term()`).
    """

    def __init__(self, ctx: zmq.Context, name: str):
        addr = f"inproc://{name}-wake-{id(self)}"
        self.rx = ctx.socket(zmq.PULL)
        self.rx.bind(addr)
        self._tx = ctx.socket(zmq.PUSH)
        self._tx.sndhwm = 1
        self._tx.connect(addr)
        self._lock = threading.Lock()

    def wake(self) -> None:
        with self._lock:
            try:
                self._tx.send(b"", zmq.NOBLOCK)
            except zmq.Again:
                pass  # a wake-up is already queued

    def drain(self) -> None:
        """Read and drop the queued wake-ups without blocking (owning thread only)."""
        while True:
            try:
                self.rx.recv(zmq.NOBLOCK)
            except zmq.Again:
                return

    @property
    def sockets(self) -> tuple[zmq.Socket, zmq.Socket]:
        return self.rx, self._tx

    def close(self) -> None:
        for sock in self.sockets:
            sock.close(0)


class ClosesOnExit:
    """`with obj:` closes `obj` on exit (every socket owner here has a `close()`)."""

    def close(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class RouterServer(ClosesOnExit):
    """Base of the bound ROUTER services (`TrajectoryReceiver`, `WeightsPublisher`, `RpcServer`).

    `_bind_router` makes the context, the CURVE authenticator (ZAP handler) when keys are given, and the bound
    socket (`self.endpoint` is the address it got, so "tcp://127.0.0.1:*" works); the subclass starts
    `self._thread` and polls `self._stop`. `close()` sets the stop event, joins the thread, closes the socket
    and `_extra_sockets()`, stops the authenticator, terminates the context, then calls `_release()`.
    """

    def _bind_router(self, endpoint: str, *, limits: Limits, curve: CurveServer | None, sndhwm: int,
                     rcvhwm: int, io_threads: int = 1) -> None:
        self._ctx = zmq.Context(io_threads=max(1, io_threads))
        self._auth = curve.start_authenticator(self._ctx) if curve else None
        self._sock = make_socket(self._ctx, zmq.ROUTER, limits=limits, curve=curve, sndhwm=sndhwm, rcvhwm=rcvhwm)
        self._sock.bind(endpoint)
        self.endpoint: str = self._sock.last_endpoint.decode()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _extra_sockets(self) -> Sequence[zmq.Socket]:
        """Sockets of the service's own context besides the ROUTER, closed with it."""
        return ()

    def _release(self) -> None:
        """What the service frees after its sockets and context are gone (a spool, a thread pool)."""

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        for sock in (self._sock, *self._extra_sockets()):
            sock.close(0)
        if self._auth is not None:
            self._auth.stop()
        self._ctx.term()
        self._release()
