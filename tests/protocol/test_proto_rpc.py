"""ROUTER/DEALER request/reply: heartbeats, per-request timeouts, resend to another endpoint, busy, dedupe."""

from __future__ import annotations

import threading
import time

import pytest
import zmq

from protocol.codec import Limits, decode
from protocol.handshake import Error
from protocol.rpc import RpcClient, RpcError, RpcServer, RpcTimeout
from protocol.sandbox_jobs import SandboxJob, SandboxResult
from protocol.sockets import recv_frames, send_message


def job(i: int, **settings) -> SandboxJob:
    return SandboxJob(job_id=f"job-{i}", task={"id": "t", "reference": "x"}, files={"kernels/k.cu": "// k"},
                      format="cpu", settings=settings)


def answering(node_id: str, calls: list | None = None):
    def handler(req):
        if calls is not None:
            calls.append(req.message.job_id)
        return SandboxResult(job_id=req.message.job_id, status="ok", result={"by": node_id}, node_id=node_id)
    return handler


def silent(req):
    return None  # never answers


@pytest.fixture
def servers():
    made = []

    def make(handler, node_id="node", **kw):
        s = RpcServer("tcp://127.0.0.1:*", handler, expect=(SandboxJob,), server_id=node_id,
                      capabilities={"formats": ["cpu"], "gpus": 0}, **kw).start()
        made.append(s)
        return s

    yield make
    for s in made:
        if s._thread is not None and s._thread.is_alive():
            s.close()


def test_call_and_hello(servers):
    a = servers(answering("A"), "A")
    with RpcClient([a.endpoint], expect=(SandboxResult,), heartbeat_s=0.1, liveness=40) as c:
        r = c.call(job(1), timeout_s=5)
        assert (r.job_id, r.node_id, r.status) == ("job-1", "A", "ok")
        assert c.wait_connected(20)
        assert c.server_hello(a.endpoint).capabilities == {"formats": ["cpu"], "gpus": 0}
        futures = [c.submit(job(i), timeout_s=5) for i in range(100)]
        assert sorted(f.result().job_id for f in futures) == sorted(f"job-{i}" for i in range(100))
    assert a.stats["heartbeats"] >= 1


def test_timeout_resends_to_another_endpoint(servers):
    a, b = servers(silent, "A"), servers(answering("B"), "B")
    with RpcClient([a.endpoint, b.endpoint], expect=(SandboxResult,), heartbeat_s=0.1, liveness=40) as c:
        assert c.wait_connected(20)  # both connected: the first endpoint, A, gets the request
        r = c.call(job(1), timeout_s=0.5, attempts=3)
        assert r.node_id == "B"
        assert c.stats["timeouts"] == 1 and c.stats["resends"] == 1
    assert a.stats["requests"] == 1 and b.stats["requests"] == 1


def test_a_dead_endpoint_is_detected_by_heartbeats_and_its_requests_move(servers):
    a_calls = []
    a = servers(lambda req: a_calls.append(req) or None, "A")  # takes the job, then dies
    b = servers(answering("B"), "B")
    with RpcClient([a.endpoint, b.endpoint], expect=(SandboxResult,), heartbeat_s=0.1, liveness=5) as c:
        assert c.wait_connected(20)
        future = c.submit(job(1), timeout_s=60)  # far longer than the heartbeat liveness
        deadline = time.monotonic() + 5
        while not a_calls and time.monotonic() < deadline:
            time.sleep(0.01)
        assert a_calls, "A never got the job"
        a.close()
        r = future.result(timeout=30)
        assert r.node_id == "B"
        assert c.stats["dead_endpoints"] >= 1 and c.stats["timeouts"] == 0  # moved before its timeout
        assert a.endpoint not in c.alive_endpoints()


def test_busy_goes_elsewhere_and_all_busy_waits(servers):
    busy = servers(lambda req: Error(code="busy", request_id=req.message.job_id, retry_after_s=0.2), "busy")
    b = servers(answering("B"), "B")
    with RpcClient([busy.endpoint, b.endpoint], expect=(SandboxResult,), heartbeat_s=0.1, liveness=40) as c:
        assert c.wait_connected(20)
        assert c.call(job(1), timeout_s=5).node_id == "B"
        assert c.stats["busy"] == 1
    state = {"n": 0}

    def busy_twice(req):
        state["n"] += 1
        if state["n"] <= 2:
            return Error(code="busy", request_id=req.message.job_id, retry_after_s=0.1)
        return SandboxResult(req.message.job_id, "ok", {}, "C")

    c_srv = servers(busy_twice, "C")
    with RpcClient([c_srv.endpoint], expect=(SandboxResult,), heartbeat_s=0.1, liveness=40) as c:
        assert c.call(job(2), timeout_s=5, attempts=1).node_id == "C"  # busy replies use up no try
        assert c.stats["busy"] == 2


def test_errors_and_timeouts_surface(servers):
    def failing(req):
        if req.message.settings.get("crash"):
            raise RuntimeError("boom")
        return Error(code="not_found", request_id=req.message.job_id, message="no such task")

    a = servers(failing, "A")
    with RpcClient([a.endpoint], expect=(SandboxResult,), heartbeat_s=0.1, liveness=40) as c:
        with pytest.raises(RpcError) as e:
            c.call(job(1), timeout_s=5)
        assert e.value.error.code == "not_found"
        with pytest.raises(RpcError) as e:
            c.call(job(2, crash=True), timeout_s=5)
        assert e.value.error.code == "internal" and "boom" in e.value.error.message
        with pytest.raises(RpcError):  # still serving after the handler raised
            c.call(job(3), timeout_s=5)
    assert a.stats["handler_errors"] == 1
    s = servers(silent, "S")
    with RpcClient([s.endpoint], expect=(SandboxResult,), heartbeat_s=0.1, liveness=40) as c:
        with pytest.raises(RpcTimeout):
            c.call(job(4), timeout_s=0.3, attempts=2)
        assert c.stats["timeouts"] == 2


def test_deferred_reply_from_another_thread(servers):
    def later(req):
        threading.Timer(0.2, req.reply, args=(SandboxResult(req.message.job_id, "ok", {}, "A"),)).start()
        return None

    a = servers(later, "A")
    with RpcClient([a.endpoint], expect=(SandboxResult,), heartbeat_s=0.05, liveness=40) as c:
        futures = [c.submit(job(i), timeout_s=5) for i in range(20)]
        assert all(f.result().status == "ok" for f in futures)


def test_a_resent_request_is_answered_from_the_cache_not_run_twice(servers):
    calls = []
    a = servers(answering("A", calls), "A")
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.connect(a.endpoint)
    try:
        for _ in range(3):
            send_message(s, job(7), envelope=[b"rid-7"])
            frames = recv_frames(s, limits=Limits(), envelope=1)
            assert frames[0].bytes == b"rid-7"
            assert decode(frames[1:], (SandboxResult,)).job_id == "job-7"
    finally:
        s.close(0)
        ctx.term()
    assert calls == ["job-7"] and a.stats["resent_replies"] == 2
