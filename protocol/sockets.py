"""Socket set-up and framed send/receive shared by every ZeroMQ pattern in this package.

- `make_socket`: LINGER 0, ZMQ_MAXMSGSIZE from the `Limits`, high-water marks from a byte budget (HWMs
  count messages, so a queue is bounded in bytes only when the HWM is derived from the message size), and
  CURVE when configured.
- `send_message`: frames sent with `copy=False`; with `track=True` every frame is tracked (pyzmq's
  `send_multipart` would track only the last), so a caller that reuses a buffer can wait for ZeroMQ.
- `recv_message`: reads frame by frame and stops keeping frames past the limits (the rest of the message is
  drained and dropped), so an oversized multipart message cannot exhaust memory.
"""

from __future__ import annotations

from typing import Any, Sequence, TypeVar

import zmq

from protocol.auth import CurveClient, CurveServer
from protocol.codec import SPLIT_BYTES, Limits, decode, encode
from protocol.errors import ProtocolError
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
