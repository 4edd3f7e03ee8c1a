"""The node's side of device-memory admission (SandboxNode._take / _run with sandbox.service_admission), driven
on a constructed, not started, node: stub workers answer canned results, stub requests keep the replies, the
devices' ledgers are set by hand. Held jobs move to another GPU that has room, are answered when their deadline
passes or the node drains; the out-of-memory re-run needs a shared GPU and the trusted side's evidence, and
shares one budget with internal_error retries."""

from __future__ import annotations

import threading
import time
import types

import pytest

from sandbox.result import EvalResult, Status
from sandbox.service import SandboxNode, ServiceConfig, _Job
from sandbox.service_admission import DeviceLedger
from sandbox.service_queue import QueuedJob

from _svc_helpers import free_port, wait_until

GiB = 2**30


class _Req:
    def __init__(self):
        self.replies = []

    def reply(self, msg):
        self.replies.append(msg)


class _Worker:
    """Stands in for WorkerProcess: answers the canned results in order."""

    def __init__(self, results=()):
        self.results = list(results)
        self.calls = 0
        self.pid = 1
        self.has_job = False

    def alive(self):
        return True

    def run(self, msg, bound):
        self.calls += 1
        return {"op": "result", "result": self.results.pop(0)}

    def stop(self):
        pass


@pytest.fixture
def node():
    n = SandboxNode(ServiceConfig(endpoint=f"tcp://127.0.0.1:{free_port()}", workers=3, build_workers=0,
                                  metrics_port=-1))
    for s in n.slots:
        s.worker = _Worker()
        s.ready = True
    yield n
    n._stop.set()
    n.server.close()
    n.metrics.close()


def _gpus(n: SandboxNode, devices=("g0", "g0", "g1")) -> None:
    """Slots on the given GPUs, 10 GiB each may be reserved."""
    for s, d in zip(n.slots, devices):
        s.device = d
    n.ledgers = {d: DeviceLedger(capacity_bytes=10 * GiB) for d in set(devices)}


def _entry(n: SandboxNode, key: str = "k", deadline_s: float = 300.0, peak_bytes: int = 0) -> tuple[QueuedJob, _Req]:
    job = types.SimpleNamespace(job_id="job-" + key, task={"id": "t"}, files={}, format="cubin")
    p = _Job(job, types.SimpleNamespace(id="t"), {}, n.sandbox_cfg, footprint_key="fp-" + key)
    n.footprints.record(p.footprint_key, peak_bytes)
    req = _Req()
    e = QueuedJob(key=key, priority=1, deadline=time.monotonic() + deadline_s, payload=p, waiters=[(req, job.job_id)])
    n._by_key[key] = e
    n._by_job[job.job_id] = e
    n.queue.push(e)
    return e, req


def _take_in_thread(n, slot):
    box = {}
    t = threading.Thread(target=lambda: box.setdefault("entry", n._take(slot)), daemon=True)
    t.start()
    return t, box


def test_a_job_too_large_for_its_slots_gpu_goes_to_another_gpus_free_slot(node):
    _gpus(node)
    node.ledgers["g0"].start(0, 8 * GiB)
    e, _ = _entry(node, peak_bytes=int(2.5 * GiB))  # reserves 5 GiB: not beside the 8 on g0
    t1, box1 = _take_in_thread(node, node.slots[1])  # g0's free slot looks first: it leaves the job queued
    time.sleep(0.3)
    assert "entry" not in box1 and node.ledgers["g0"].holder is None and len(node.queue) == 1
    assert node._take(node.slots[2]) is e  # g1's slot takes it
    assert node.ledgers["g1"].reserved == {2: 5 * GiB}
    node._stop.set()
    t1.join(3)


def test_a_held_job_moves_when_another_gpu_frees_up(node):
    _gpus(node)
    node.ledgers["g0"].start(0, 8 * GiB)
    node.ledgers["g1"].start(2, 8 * GiB)
    e, _ = _entry(node, peak_bytes=int(2.5 * GiB))
    t1, box1 = _take_in_thread(node, node.slots[1])
    wait_until(lambda: node.ledgers["g0"].holder == 1, 5.0, "the job held on g0")  # nowhere to go: held on g0
    with node._cv:
        node.ledgers["g1"].finish(2)  # g1 is free now, g0 still full
        node._cv.notify_all()
    wait_until(lambda: len(node.queue) == 1, 5.0, "the job back in the queue")  # not waiting for g0
    assert node._take(node.slots[2]) is e
    node._stop.set()
    t1.join(3)
    assert box1.get("entry") is None and node.ledgers["g0"].holder is None


def test_a_held_job_whose_deadline_passes_is_answered_gone(node):
    _gpus(node, ("g0", "g0", "g0"))
    node.ledgers["g0"].start(0, 8 * GiB)
    e, req = _entry(node, deadline_s=0.5, peak_bytes=3 * GiB)
    t, box = _take_in_thread(node, node.slots[1])
    wait_until(lambda: node.ledgers["g0"].holder == 1, 5.0, "the job held on g0")
    wait_until(lambda: req.replies, 5.0, "the gone answer")
    assert req.replies[0].code == "gone" and node._running == 0 and node.ledgers["g0"].holder is None
    node._stop.set()
    t.join(3)
    assert box.get("entry") is None and node.ledgers["g0"].reserved == {0: 8 * GiB}


def test_an_expired_job_is_answered_at_once_even_when_the_next_one_must_wait(node):
    _gpus(node, ("g0", "g0", "g0"))
    node.ledgers["g0"].start(0, 8 * GiB)
    old, old_req = _entry(node, "old", deadline_s=-1.0)
    big, big_req = _entry(node, "big", peak_bytes=3 * GiB)  # 6 GiB: waits for slot 0's job
    assert node._take(node.slots[1]) is None  # answered the expired job and returned
    assert len(old_req.replies) == 1 and old_req.replies[0].code == "gone" and len(node.queue) == 1
    t, box = _take_in_thread(node, node.slots[1])
    wait_until(lambda: node.ledgers["g0"].holder == 1, 5.0, "the job held on g0")  # now the large one is held
    node._stop.set()
    t.join(3)
    assert big_req.replies == [] and len(node.queue) == 1  # put back on stop


def test_drain_hands_a_held_job_back(node):
    _gpus(node, ("g0", "g0", "g0"))
    node.ledgers["g0"].start(0, 8 * GiB)
    with node._mu:
        node._running += 1  # slot 0's long job
    e, req = _entry(node, peak_bytes=3 * GiB)
    t, box = _take_in_thread(node, node.slots[1])
    wait_until(lambda: node.ledgers["g0"].holder == 1, 5.0, "the job held on g0")
    assert node.drain(timeout_s=1.0) is False  # slot 0's job still runs
    assert len(req.replies) == 1 and req.replies[0].code == "busy"
    node._stop.set()
    t.join(3)
    assert box.get("entry") is None and node._running == 1 and len(node.queue) == 0


def _results(status=Status.RUNTIME_ERROR, message="verify: torch.OutOfMemoryError: CUDA out of memory. Tried to "
             "allocate 2.00 GiB", free=0.02) -> dict:
    d = EvalResult.failure(status, message).to_dict()
    d["device_free_fraction"] = free
    return d


def _evaluate(node, slot, e, req, beside: bool = True) -> int:
    """Run `e` on `slot` until it is answered, with another job beside it on the first run; evaluations made."""
    led = node.ledgers[slot.device]
    for _ in range(5):
        entry = node._take(slot)
        assert entry is e
        if beside and not led.shared:
            led.start(1, 0)
            led.shared.update({slot.index, 1})
        node._run(slot, entry)
        with node._mu:
            node._running -= 1
            led.finish(slot.index)
        led.finish(1)
        if req.replies:
            break
    return slot.worker.calls


def test_out_of_memory_beside_others_with_trusted_evidence_is_run_again_alone(node):
    _gpus(node, ("g0", "g0", "g0"))
    slot = node.slots[0]
    ok = EvalResult(status="ok", reward=1.0, message="fast").to_dict()
    slot.worker = _Worker([_results(), ok])
    e, req = _entry(node)
    assert _evaluate(node, slot, e, req) == 2
    assert e.payload.exclusive and req.replies[0].status == "ok"
    assert any("evaluated again alone" in x for x in req.replies[0].result["log"])


@pytest.mark.parametrize("why, result, devices, beside", [
    ("plenty of free memory: the candidate's own text", _results(free=0.6), ("g0", "g0", "g0"), True),
    ("not read (the profile, or the CPU backend)", _results(free=-1.0), ("g0", "g0", "g0"), True),
    ("load_error counts, but only beside others", _results(Status.LOAD_ERROR), ("g0", "g0", "g0"), False),
    ("a failure that names no out-of-memory error", _results(message="verify: IndexError"), ("g0", "g0", "g0"), True),
    ("the CPU backend's shared ledger", _results(), ("cpu", "cpu", "cpu"), True),
])
def test_no_re_run_without_a_shared_gpu_and_the_trusted_evidence(node, why, result, devices, beside):
    _gpus(node, devices)
    slot = node.slots[0]
    slot.worker = _Worker([result])
    e, req = _entry(node)
    assert _evaluate(node, slot, e, req, beside) == 1, why
    assert req.replies[0].status == result["status"] and not e.payload.exclusive


def test_one_budget_for_out_of_memory_and_internal_error_re_runs(node):
    _gpus(node, ("g0", "g0", "g0"))
    slot = node.slots[0]
    ierr = EvalResult.failure(Status.INTERNAL_ERROR, "candidate worker did not start").to_dict()
    ok = EvalResult(status="ok", reward=1.0, message="fast").to_dict()
    slot.worker = _Worker([_results(), ierr, ok])
    e, req = _entry(node)
    assert _evaluate(node, slot, e, req) == 2  # internal_error_retries=1: one re-run in all
    assert req.replies[0].status == "internal_error"


def test_config_refuses_a_memory_factor_that_is_not_a_finite_positive_number():
    for bad in (float("inf"), float("nan"), 0.0, -1.0):
        with pytest.raises(ValueError, match="job_memory_factor"):
            ServiceConfig(job_memory_factor=bad)
    with pytest.raises(ValueError, match="oom_free_fraction"):
        ServiceConfig(oom_free_fraction=0.0)
