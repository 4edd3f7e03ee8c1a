"""One real node process (CPU backend, one worker) and a real client over loopback: results, the result store,
bad jobs, priorities, deadlines, metrics in logs and at the Prometheus endpoint, the timing lock's `contended`
flag."""

from __future__ import annotations

import dataclasses
import time
import urllib.request
import uuid

import pytest

from sandbox.client import PRIORITY_EVALUATION, PRIORITY_TRAINING, SandboxClient, SandboxClientError
from sandbox.service_lock import DeviceTimingLock

from _svc_helpers import QUICK, corpus, job, node_status, start_node, wait_until


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("node")
    lock_dir = tmp / "locks"
    n = start_node(tmp, "timing_lock=always", f"timing_lock_dir={lock_dir}", "cpu_lock_key=cpu-test",
                   "timing_lock_timeout_s=0.5", "queue_max=8")
    n.lock_dir = lock_dir
    yield n
    n.stop()


@pytest.fixture(scope="module")
def client(node):
    with SandboxClient([node.endpoint], client_id="test-node") as c:
        assert c.wait_for_nodes(timeout_s=60)
        yield c


@pytest.fixture(scope="module")
def sols():
    return corpus()


def test_results_reuse_and_resent_job_ids(client, node, sols):
    salt = uuid.uuid4().hex
    fast = client.run(job(sols["fast"], salt=salt, job_id=f"fast-{salt}"))
    assert fast.status == "ok" and fast.result["reward"] >= 0 and fast.node_id == node.info["node_id"]
    st = fast.result["stage_ms"]
    assert st["queue"] >= 0 and st["node"] >= st["total"] > 0
    wrong = client.run(job(sols["wrong"], salt=salt))
    assert wrong.status == "incorrect" and wrong.result["reward"] == -1
    done = wait_until(lambda: (c := node_status(client, node.endpoint)["counts"]).get("jobs_incorrect") and c, 5,
                      "both results in the node's counters")
    # stage seconds summed over the node's jobs come with the status (clients difference two of them)
    stage_s = node_status(client, node.endpoint)["stage_s"]
    assert stage_s["total"] * 1e3 >= st["total"] and stage_s["verify"] > 0, stage_s
    # the same content under a new job id: answered from memory, not evaluated again
    t0 = time.monotonic()
    again = client.run(job(sols["fast"], salt=salt))
    assert again.result["reward"] == fast.result["reward"] and again.result["timing"] == fast.result["timing"]
    assert "same content" in again.result["log"][-1]
    # the same job id again (an actor resending after a restart): answered from memory by job id
    resent = client.run(job(sols["fast"], salt=salt, job_id=f"fast-{salt}"))
    assert resent.result["timing"] == fast.result["timing"] and "resent job id" in resent.result["log"][-1]
    assert time.monotonic() - t0 < 5
    after = wait_until(lambda: (c := node_status(client, node.endpoint)["counts"]).get("cache_job_id") and c, 5,
                       "job id hit in the node's counters")
    assert after.get("jobs_ok", 0) == done.get("jobs_ok", 0)  # nothing new ran
    assert after["cache_content"] >= 1


def test_bad_jobs_get_clear_errors_and_the_node_keeps_serving(client, sols):
    with pytest.raises(SandboxClientError) as e:
        client.run(job(sols["fast"], settings={"isolation": "none"}))
    assert e.value.code == "bad_message" and e.value.field == "SandboxJob.settings.isolation"
    with pytest.raises(SandboxClientError) as e:
        client.run(dataclasses.replace(job(sols["fast"]), format="cubin"))
    assert e.value.code == "bad_message" and e.value.field == "SandboxJob.format"
    with pytest.raises(SandboxClientError) as e:
        client.run(dataclasses.replace(job(sols["fast"]), task={"id": "x"}))
    assert e.value.code == "bad_message" and "task" in e.value.field
    res = client.run(job(sols["crash"], salt=uuid.uuid4().hex))
    assert res.status == "runtime_error"


def test_evaluation_jobs_overtake_queued_training_jobs(client, sols):
    salt = uuid.uuid4().hex
    slow = dict(QUICK, reps=20)
    order: list[str] = []
    wait_until(lambda: node_status(client, client.endpoints[0])["running"] == 0, 30, "the previous jobs to end")
    blocker = client.submit(job(sols["slow"], salt=salt + "b", settings=slow))
    wait_until(lambda: node_status(client, client.endpoints[0])["running"] == 1, 30, "the blocker to run")
    futs = {}
    for name, prio in (("train-1", PRIORITY_TRAINING), ("train-2", PRIORITY_TRAINING), ("eval", PRIORITY_EVALUATION)):
        f = client.submit(job(sols["fast"], salt=salt + name, priority=prio))
        f.add_done_callback(lambda _f, n=name: order.append(n))
        futs[name] = f
        time.sleep(0.2)  # arrival order: train-1, train-2, eval
    for f in (blocker, *futs.values()):
        f.result(timeout=240)
    assert order == ["eval", "train-1", "train-2"]
    assert futs["eval"].result().result["stage_ms"]["queue"] < futs["train-2"].result().result["stage_ms"]["queue"]


def test_job_whose_deadline_passes_in_the_queue_is_not_run(client, sols):
    salt = uuid.uuid4().hex
    # the slot's previous job counts as running for a moment after its reply: "running == 1" must be the blocker
    wait_until(lambda: node_status(client, client.endpoints[0])["running"] == 0, 30, "the previous jobs to end")
    blocker = client.submit(job(sols["slow"], salt=salt, settings=dict(QUICK, reps=20)))
    wait_until(lambda: node_status(client, client.endpoints[0])["running"] == 1, 30, "the blocker to run")
    before = node_status(client, client.endpoints[0])["counts"]
    t0 = time.monotonic()
    with pytest.raises(SandboxClientError) as e:
        client.run(job(sols["fast"], salt=salt + "late", deadline_s=1.0))
    assert time.monotonic() - t0 < 10  # the caller never hangs past its deadline (plus the client's margin)
    assert e.value.code in ("timeout", "gone", "busy")
    assert blocker.result(timeout=240).status == "ok"
    after = wait_until(lambda: (c := node_status(client, client.endpoints[0])["counts"]).get("jobs_ok", 0) >
                       before.get("jobs_ok", 0) and c, 10, "the blocker's result in the counters")
    refused = sum(after.get(k, 0) - before.get(k, 0) for k in ("rejected_expired", "rejected_busy"))
    assert refused >= 1
    assert after.get("jobs_ok", 0) - before.get("jobs_ok", 0) == 1  # only the blocker ran


def test_result_timed_without_the_lock_is_flagged_contended_and_not_reused(client, node, sols):
    lock = DeviceTimingLock("cpu-test", node.lock_dir)
    salt = uuid.uuid4().hex
    with lock.shared() as held:  # another user of the device is busy for the whole evaluation
        assert held
        res = client.run(job(sols["fast"], salt=salt))
    assert res.status == "ok" and res.result["contended"] is True
    assert res.result["stage_ms"]["timing_lock_wait"] >= 400
    assert any("re-measure" in line for line in res.result["log"])
    again = client.run(job(sols["fast"], salt=salt))  # same content: measured again, now with the lock
    assert again.result["contended"] is False and again.result["timing"] != res.result["timing"]
    # node status comes with heartbeats: wait for one that counts the contended result
    assert wait_until(lambda: node_status(client, node.endpoint)["counts"].get("contended", 0) >= 1, 10,
                      "the contended result in the node's counters")


def test_metrics_in_logs_and_at_the_prometheus_endpoint(client, node, sols):
    assert client.run(job(sols["fast"])).status == "ok"  # this test's own job: it does not lean on the others
    body = urllib.request.urlopen(f"http://127.0.0.1:{node.info['metrics_port']}/metrics", timeout=10).read().decode()
    for name in ("cuda_agent_sandbox_queue_depth", "cuda_agent_sandbox_workers_busy", "cuda_agent_sandbox_jobs_total",
                 "cuda_agent_sandbox_worker_restarts_total", 'cuda_agent_sandbox_stage_seconds_bucket{le="1.0",stage="verify"}',
                 'stage="queue"', "cuda_agent_sandbox_rejected_total"):
        assert name in body, name
    ok = [ln for ln in body.splitlines() if ln.startswith('cuda_agent_sandbox_jobs_total{status="ok"}')]
    assert ok and float(ok[0].split()[-1]) >= 1
    wait_until(lambda: "sandbox/jobs_ok=" in node.log_path.read_text(), 10, "a metrics log line")
    line = [ln for ln in node.log_path.read_text().splitlines() if "sandbox/jobs_ok=" in ln][-1]
    for key in ("sandbox/queue_depth=", "sandbox/busy_workers=", "sandbox/verify_p50_ms=", "sandbox/queue_p95_ms="):
        assert key in line
