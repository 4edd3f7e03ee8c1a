"""Request/reply over ROUTER (server) / DEALER (client) with heartbeats, per-request timeouts and resend to
another endpoint. Reusable: the sandbox node service is one `RpcServer` handler; anything else can be too.

Wire: client -> server frames = [request id, *message]; server -> client = [request id, *reply]. The request
id is 1..64 bytes, the same on every resend of one request; an empty id marks session traffic (`Hello`,
`Heartbeat`), which the server loop answers itself.

Server (`RpcServer`): one loop thread owns the ROUTER. It answers heartbeats even while handlers are busy
(with the map its optional `status()` callable returns, e.g. the free capacity of a sandbox node), refuses bad input with `Error(code="bad_message", field=...)` (logged and counted), and calls
`handler(request)` for each request. The handler returns the reply, or None and answers later from any
thread with `request.reply(msg)` (work queued elsewhere). A resent request whose reply is cached is answered
from the cache; one still running is not run twice. To shed load, a handler returns
`Error(code="busy", retry_after_s=...)` (never cached).

Client (`RpcClient`): one DEALER per endpoint, owned by a background thread. `submit` returns a Future.
A request goes to the live, not-busy endpoint with the most free capacity: the `free` number of its last
heartbeat status less the requests sent to it since, or, for a server that advertises none, the fewest
requests of this client outstanding there. Every `heartbeat_s` it pings each endpoint; one silent for `liveness` heartbeats is dead: its socket is
rebuilt and its requests go to another endpoint at once. A request with no reply within `timeout_s` is
resent to another endpoint (`attempts` tries in all); a "busy" reply moves it to another endpoint without
using up a try (waiting `retry_after_s` when every endpoint is busy) until `timeout_s * attempts` have
passed. Other `Error` replies fail the Future with `RpcError`.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import logging
import queue
import threading
import time
import uuid
from typing import Any, Callable, Sequence

import zmq

from protocol.auth import CurveClient, CurveServer
from protocol.codec import Limits, decode, encode
from protocol.errors import ProtocolError
from protocol.handshake import Error, Heartbeat, Hello
from protocol.message import Message
from protocol.sockets import (ClosesOnExit, RouterServer, WakePipe, bad_message, frame_bytes, hwm_for, make_socket,
                              recv_frames, send_message)

log = logging.getLogger(__name__)

MAX_REQUEST_ID_BYTES = 64
#: Default bounds for requests and replies (sandbox jobs carry source files: up to 64 MiB of header).
RPC_LIMITS = Limits(max_header_bytes=64 << 20, max_str_bytes=8 << 20, max_items=1 << 16, max_arrays=16,
                    max_array_bytes=256 << 20, max_frame_bytes=256 << 20, max_frames=17,
                    max_message_bytes=512 << 20)


class RpcError(RuntimeError):
    """The server answered with an `Error`; `error` holds it."""

    def __init__(self, error: Error):
        super().__init__(f"{error.code}: {error.message}" + (f" (field {error.field})" if error.field else ""))
        self.error = error


class RpcTimeout(TimeoutError):
    """No endpoint answered within the request's tries."""


@dataclasses.dataclass(eq=False)
class RpcRequest:
    """One request as the handler sees it: the decoded `message`, its `request_id`, and `reply()`."""

    message: Message
    request_id: bytes
    _server: "RpcServer"

    def reply(self, msg: Message) -> None:
        """Answer this request (callable from any thread, once)."""
        self._server.reply(self.request_id, msg)


class RpcServer(RouterServer):
    """ROUTER side of request/reply.

    Args:
      endpoint: where to bind, e.g. "tcp://*:5557".
      handler: called in the loop thread for each new request; must return quickly (a reply or None).
      expect: request message classes this service accepts (anything else is a "bad_message").
      server_id, role, capabilities: what `Hello` answers say.
      limits: bounds on incoming messages (also ZMQ_MAXMSGSIZE).
      reply_cache: replies kept for answering resends.
      curve: CURVE server keys.
      status: called in the loop thread for every heartbeat answer; returns a plain map (e.g. {"free": 2}),
        sent as `Heartbeat.status`. It must be quick and never block; an exception is logged and sends {}.

    Counters in `stats`: requests, replies, resent_replies, duplicates, heartbeats, bad_messages,
    handler_errors, dropped_replies.
    """

    def __init__(self, endpoint: str, handler: Callable[[RpcRequest], Message | None], *,
                 expect: Sequence[type[Message]], server_id: str = "server", role: str = "sandbox",
                 capabilities: dict[str, Any] | None = None, limits: Limits = RPC_LIMITS, reply_cache: int = 1024,
                 queue_bytes: int = 1 << 30, curve: CurveServer | None = None,
                 status: Callable[[], dict[str, Any]] | None = None):
        self.handler = handler
        self.status = status
        self.expect = tuple(expect)
        self.hello = Hello(role=role, id=server_id, capabilities=capabilities or {})
        self.server_id = server_id
        self.limits = limits
        self.reply_cache_size = reply_cache
        self.stats = collections.Counter({k: 0 for k in ("requests", "replies", "resent_replies", "duplicates",
                                                         "heartbeats", "bad_messages", "handler_errors",
                                                         "dropped_replies")})
        self._running: dict[bytes, bytes] = {}                  # request id -> peer to answer
        self._done: collections.OrderedDict[bytes, list[Any]] = collections.OrderedDict()  # id -> reply frames
        self._outbox: queue.SimpleQueue[tuple[bytes, Message]] = queue.SimpleQueue()
        self._bind_router(endpoint, limits=limits, curve=curve, sndhwm=1000,
                          rcvhwm=hwm_for(queue_bytes, limits.max_message_bytes, minimum=8))
        self._wakeup = WakePipe(self._ctx, "rpc")

    def start(self) -> "RpcServer":
        self._thread = threading.Thread(target=self.serve, name=f"rpc-{self.server_id}", daemon=True)
        self._thread.start()
        return self

    def serve(self) -> None:
        """Serve until `close()` (blocking)."""
        self._loop_ident = threading.get_ident()
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self._wakeup.rx, zmq.POLLIN)
        while not self._stop.is_set():
            events = dict(poller.poll(200))
            if self._wakeup.rx in events:
                self._wakeup.drain()
            while True:
                try:
                    request_id, msg = self._outbox.get_nowait()
                except queue.Empty:
                    break
                self._send_reply(request_id, msg)
            if self._sock in events:
                for _ in range(256):
                    if not self._serve_one():
                        break

    def reply(self, request_id: bytes, msg: Message) -> None:
        """Answer request `request_id` with `msg` (thread-safe)."""
        if threading.get_ident() == getattr(self, "_loop_ident", None):
            self._send_reply(request_id, msg)
            return
        self._outbox.put((request_id, msg))
        self._wakeup.wake()

    def _serve_one(self) -> bool:
        try:
            frames = recv_frames(self._sock, limits=self.limits, envelope=2, flags=zmq.NOBLOCK)
        except zmq.Again:
            return False
        except ProtocolError as e:
            self._bad(e.envelope, e)
            return True
        if len(frames) < 3:
            self._bad(frames[:1], ProtocolError("frames", "expected [request id, message frames...]"))
            return True
        peer, request_id = frames[0].bytes, frames[1].bytes
        if len(request_id) > MAX_REQUEST_ID_BYTES:
            self._bad(frames[:1], ProtocolError("request_id", f"longer than {MAX_REQUEST_ID_BYTES} bytes"))
            return True
        expect = (Heartbeat, Hello) if not request_id else self.expect
        try:
            msg = decode(frames[2:], expect, self.limits)
        except ProtocolError as e:
            self._bad(frames[:2], e)
            return True
        if isinstance(msg, Heartbeat):
            self.stats["heartbeats"] += 1
            self._send(peer, b"", Heartbeat(id=self.server_id, seq=msg.seq, time_s=time.time(),
                                            status=self._status()))
        elif isinstance(msg, Hello):
            self._send(peer, b"", self.hello)
        elif request_id in self._done:
            self.stats["resent_replies"] += 1
            self._done.move_to_end(request_id)
            self._send_frames(peer, request_id, self._done[request_id])
        elif request_id in self._running:
            self.stats["duplicates"] += 1
            self._running[request_id] = peer  # answer the newest connection of that client
        else:
            self.stats["requests"] += 1
            self._running[request_id] = peer
            try:
                out = self.handler(RpcRequest(msg, request_id, self))
                if out is not None and not isinstance(out, Message):
                    raise TypeError(f"handler returned {type(out).__name__}, not a Message or None")
            except Exception as e:  # a handler bug must not take the service down
                self.stats["handler_errors"] += 1
                log.exception("rpc %s: handler failed", self.server_id)
                out = Error(code="internal", message=f"{type(e).__name__}: {e}"[:4096])
            if out is not None:
                self._send_reply(request_id, out)
        return True

    def _status(self) -> dict[str, Any]:
        if self.status is None:
            return {}
        try:
            return self.status()
        except Exception:  # a status bug must not take the service down
            log.exception("rpc %s: status() failed", self.server_id)
            return {}

    def _send_reply(self, request_id: bytes, msg: Message) -> None:
        peer = self._running.pop(request_id, None)
        if peer is None:
            log.warning("rpc %s: reply to unknown or answered request %r dropped", self.server_id, request_id)
            return
        frames = encode(msg)
        if not (isinstance(msg, Error) and msg.code in ("busy", "internal")):
            self._done[request_id] = frames
            while len(self._done) > self.reply_cache_size:
                self._done.popitem(last=False)
        self.stats["replies"] += 1
        self._send_frames(peer, request_id, frames)

    def _send(self, peer: bytes, request_id: bytes, msg: Message) -> None:
        self._send_frames(peer, request_id, encode(msg))

    def _send_frames(self, peer: bytes, request_id: bytes, frames: list[Any]) -> None:
        try:
            self._sock.send_multipart([peer, request_id, *frames], flags=zmq.NOBLOCK, copy=False)
        except (zmq.Again, zmq.ZMQError):  # client gone or its queue full: it resends if it still cares
            self.stats["dropped_replies"] += 1

    def _bad(self, envelope: list[Any], err: ProtocolError) -> None:
        self.stats["bad_messages"] += 1
        log.warning("rpc %s: bad message: %s", self.server_id, err)
        if len(envelope) >= 1:
            rid = envelope[1].bytes if len(envelope) > 1 and isinstance(envelope[1], zmq.Frame) else b""
            rid = rid if len(rid) <= MAX_REQUEST_ID_BYTES else b""
            self._send(frame_bytes(envelope[0]), rid, bad_message(err))

    def _extra_sockets(self) -> tuple[zmq.Socket, ...]:
        return self._wakeup.sockets

@dataclasses.dataclass(eq=False)
class _Endpoint:
    address: str
    sock: zmq.Socket
    last_seen: float
    alive: bool = True
    busy_until: float = 0.0
    hello: Hello | None = None
    load: int = 0
    status: dict[str, Any] = dataclasses.field(default_factory=dict)  # last Heartbeat.status
    free: float | None = None          # status["free"] when the server advertises it
    sent_since_status: int = 0         # requests sent since that status arrived

    def free_estimate(self) -> float:
        """Free capacity as this client sees it (higher is better)."""
        return self.free - self.sent_since_status if self.free is not None else -float(self.load)


@dataclasses.dataclass(eq=False)
class _Pending:
    rid: bytes
    frames: list[Any]
    future: concurrent.futures.Future
    timeout_s: float
    attempts: int
    tries_left: int
    give_up_at: float
    endpoint: _Endpoint | None = None
    attempt_deadline: float = 0.0
    not_before: float = 0.0
    tried: set = dataclasses.field(default_factory=set)


class RpcClient(ClosesOnExit):
    """DEALER side of request/reply over one or more equivalent endpoints.

    Args:
      endpoints: server addresses, e.g. ["tcp://node-a:5557", "tcp://node-b:5557"]; among equally loaded
        live endpoints a request goes to the first in this order.
      expect: reply message classes (an `Error` is always accepted and fails the Future).
      client_id: this client's id (its `Hello`).
      heartbeat_s: ping interval per endpoint; liveness: missed pings before an endpoint is dead.
      limits: bounds on replies.
      curve: CURVE client keys (the same server key for every endpoint).

    Counters in `stats`: submitted, replies, resends, busy, timeouts, errors, late_replies, bad_replies,
    dead_endpoints.
    """

    def __init__(self, endpoints: Sequence[str], *, expect: Sequence[type[Message]], client_id: str = "client",
                 heartbeat_s: float = 1.0, liveness: int = 3, limits: Limits = RPC_LIMITS,
                 curve: CurveClient | None = None):
        if not endpoints:
            raise ValueError("RpcClient needs at least one endpoint")
        self.expect = tuple(expect) + (Error,)
        self.client_id = client_id
        self.heartbeat_s = heartbeat_s
        self.liveness = liveness
        self.limits = limits
        self.curve = curve
        self.stats = collections.Counter({k: 0 for k in ("submitted", "replies", "resends", "busy", "timeouts",
                                                         "errors", "late_replies", "bad_replies",
                                                         "dead_endpoints")})
        self._ctx = zmq.Context()
        now = time.monotonic()
        self._endpoints = [_Endpoint(a, self._connect(a), now) for a in endpoints]
        self._pending: dict[bytes, _Pending] = {}
        self._submissions: queue.SimpleQueue[_Pending] = queue.SimpleQueue()
        self._wakeup = WakePipe(self._ctx, "rpc-client")
        self._stop = threading.Event()
        self._hb_seq = 0
        self._next_heartbeat = now
        self._thread = threading.Thread(target=self._run, name=f"rpc-client-{client_id}", daemon=True)
        self._thread.start()

    def _connect(self, address: str) -> zmq.Socket:
        sock = make_socket(self._ctx, zmq.DEALER, limits=self.limits, curve=self.curve, sndhwm=1000,
                           rcvhwm=hwm_for(1 << 30, self.limits.max_message_bytes, minimum=8))
        sock.immediate = True  # never queue a request for an endpoint that is not connected
        sock.connect(address)
        return sock

    # -- caller side -----------------------------------------------------------------------------------
    def submit(self, msg: Message, *, timeout_s: float = 30.0, attempts: int = 3) -> concurrent.futures.Future:
        """Send `msg`; the Future resolves to the reply message, or fails with RpcError / RpcTimeout."""
        if timeout_s <= 0 or attempts < 1:
            raise ValueError("timeout_s must be > 0 and attempts >= 1")
        future: concurrent.futures.Future = concurrent.futures.Future()
        p = _Pending(uuid.uuid4().bytes, encode(msg), future, timeout_s, attempts, attempts,
                     time.monotonic() + timeout_s * attempts)
        self._submissions.put(p)
        self._wake()
        return future

    def call(self, msg: Message, *, timeout_s: float = 30.0, attempts: int = 3) -> Message:
        """`submit(...).result()`: the reply, or RpcError / RpcTimeout."""
        return self.submit(msg, timeout_s=timeout_s, attempts=attempts).result()

    def alive_endpoints(self) -> list[str]:
        return [e.address for e in self._endpoints if e.alive]

    def endpoint_status(self) -> dict[str, dict[str, Any]]:
        """Per endpoint: alive, busy (until a "busy" reply's retry time), outstanding (this client's requests
        there) and status (the server's last `Heartbeat.status`). A snapshot, safe from any thread."""
        now = time.monotonic()
        return {e.address: {"alive": e.alive, "busy": e.busy_until > now, "outstanding": e.load,
                            "status": dict(e.status)} for e in list(self._endpoints)}

    def wait_connected(self, timeout_s: float = 10.0) -> bool:
        """Wait until every endpoint has answered the opening `Hello`; False on timeout."""
        deadline = time.monotonic() + timeout_s
        while any(e.hello is None for e in self._endpoints):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.005)
        return True

    def server_hello(self, address: str) -> Hello | None:
        """The `Hello` the server at `address` answered with, once it has."""
        return next((e.hello for e in self._endpoints if e.address == address), None)

    def _wake(self) -> None:
        self._wakeup.wake()

    # -- I/O thread -------------------------------------------------------------------------------------
    def _run(self) -> None:
        for e in self._endpoints:
            self._send_session(e, Hello(role="client", id=self.client_id))
        while not self._stop.is_set():
            poller = zmq.Poller()
            poller.register(self._wakeup.rx, zmq.POLLIN)
            for e in self._endpoints:
                poller.register(e.sock, zmq.POLLIN)
            events = dict(poller.poll(self._next_timer_ms()))
            if self._wakeup.rx in events:
                self._wakeup.drain()
            while True:
                try:
                    p = self._submissions.get_nowait()
                except queue.Empty:
                    break
                self.stats["submitted"] += 1
                self._pending[p.rid] = p
            for e in self._endpoints:
                if e.sock in events:
                    self._read(e)
            self._tick()

    def _next_timer_ms(self) -> int:
        now = time.monotonic()
        t = self._next_heartbeat
        for p in self._pending.values():
            t = min(t, p.attempt_deadline if p.endpoint else max(p.not_before, now + 0.05), p.give_up_at)
        return max(1, int((t - now) * 1000) + 1)

    def _send_session(self, e: _Endpoint, msg: Message) -> None:
        try:
            send_message(e.sock, msg, envelope=[b""], flags=zmq.NOBLOCK)
        except zmq.Again:
            pass  # not connected (yet): liveness will tell

    def _read(self, e: _Endpoint) -> None:
        while True:
            try:
                frames = recv_frames(e.sock, limits=self.limits, envelope=1, flags=zmq.NOBLOCK)
                rid = frames[0].bytes
                msg = decode(frames[1:], (Heartbeat, Hello, Error) if not rid else self.expect, self.limits)
            except zmq.Again:
                return
            except ProtocolError as err:
                self.stats["bad_replies"] += 1
                log.warning("rpc client %s: bad reply from %s: %s", self.client_id, e.address, err)
                continue
            e.last_seen = time.monotonic()
            if not e.alive:
                e.alive = True
                log.info("rpc client %s: %s is back", self.client_id, e.address)
            if not rid:
                if isinstance(msg, Hello):
                    e.hello = msg
                elif isinstance(msg, Heartbeat) and msg.status:
                    e.status = msg.status
                    free = msg.status.get("free")
                    e.free = float(free) if isinstance(free, (int, float)) and not isinstance(free, bool) else None
                    e.sent_since_status = 0
                continue
            p = self._pending.get(rid)
            if p is None:
                self.stats["late_replies"] += 1
                continue
            self._unassign(p)
            if isinstance(msg, Error) and msg.code == "busy":
                self.stats["busy"] += 1
                e.busy_until = time.monotonic() + max(msg.retry_after_s, 0.01)
                p.not_before = 0.0
                continue  # reassigned in _tick
            del self._pending[rid]
            if isinstance(msg, Error):
                self.stats["errors"] += 1
                p.future.set_exception(RpcError(msg))
            else:
                self.stats["replies"] += 1
                p.future.set_result(msg)

    def _unassign(self, p: _Pending) -> None:
        if p.endpoint is not None:
            p.endpoint.load -= 1
            p.endpoint = None

    def _tick(self) -> None:
        now = time.monotonic()
        if now >= self._next_heartbeat:
            self._hb_seq += 1
            for e in self._endpoints:
                if e.alive and now - e.last_seen > self.heartbeat_s * self.liveness:
                    self._declare_dead(e)
                if e.hello is None:
                    self._send_session(e, Hello(role="client", id=self.client_id))
                self._send_session(e, Heartbeat(id=self.client_id, seq=self._hb_seq))
            self._next_heartbeat = now + self.heartbeat_s
        for rid, p in list(self._pending.items()):
            if p.future.cancelled():
                self._unassign(p)
                del self._pending[rid]
            elif p.endpoint is not None and now >= p.attempt_deadline:
                self.stats["timeouts"] += 1
                self._unassign(p)
                p.tries_left -= 1
                if p.tries_left <= 0 or now >= p.give_up_at:
                    self._fail(p, f"no reply after {p.attempts - p.tries_left} tries of {p.timeout_s:.1f} s "
                                  f"({len(p.tried)} endpoint(s))")
            elif p.endpoint is None and now >= p.give_up_at:
                self._fail(p, f"no endpoint answered within {p.timeout_s * p.attempts:.1f} s")
            if rid in self._pending and p.endpoint is None and now >= p.not_before:
                self._dispatch(p, now)

    def _fail(self, p: _Pending, why: str) -> None:
        self._unassign(p)
        self._pending.pop(p.rid, None)
        p.future.set_exception(RpcTimeout(why))

    def _declare_dead(self, e: _Endpoint) -> None:
        log.warning("rpc client %s: %s silent for %.1f s, marked dead", self.client_id, e.address,
                    self.heartbeat_s * self.liveness)
        self.stats["dead_endpoints"] += 1
        e.alive = False
        e.sock.close(0)  # drop whatever is queued for it; a fresh socket reconnects
        e.sock = self._connect(e.address)
        for p in self._pending.values():
            if p.endpoint is e:
                self._unassign(p)  # moved to another endpoint in _tick, without using up a try

    def _dispatch(self, p: _Pending, now: float) -> None:
        ready = [e for e in self._endpoints if e.alive and e.busy_until <= now]
        if not ready:
            busy = [e.busy_until for e in self._endpoints if e.alive]
            p.not_before = min(busy) if busy else now + 0.05
            return
        ready.sort(key=lambda e: (e.address in p.tried, -e.free_estimate(), e.load))
        for e in ready:
            try:
                e.sock.send_multipart([p.rid, *p.frames], flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                continue  # not connected or full: try the next one
            if p.tried:
                self.stats["resends"] += 1
            p.tried.add(e.address)
            p.endpoint = e
            e.load += 1
            e.sent_since_status += 1
            p.attempt_deadline = min(now + p.timeout_s, p.give_up_at)
            return
        p.not_before = now + 0.05

    def close(self) -> None:
        """Stop; requests still pending fail with RpcTimeout."""
        self._stop.set()
        self._wake()
        self._thread.join()
        for p in list(self._pending.values()):
            if not p.future.done():
                p.future.set_exception(RpcTimeout("client closed"))
        for e in self._endpoints:
            e.sock.close(0)
        self._wakeup.close()
        self._ctx.term()
