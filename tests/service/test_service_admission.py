"""Device-memory admission of the sandbox node (sandbox.service_admission): the ledger's decisions, the
out-of-memory test on results, the learned task footprints; and on a real two-worker node (CPU backend) the
one exclusive re-run of a job that ran out of memory beside another job, and none for one that ran alone."""

from __future__ import annotations

import time
import uuid

import pytest

from sandbox.client import SandboxClient
from sandbox.service_admission import DeviceLedger, TaskFootprints, out_of_memory, task_footprint_key

from _svc_helpers import QUICK, corpus, job, node_status, start_node, wait_until

GiB = 2**30


def test_ledger_admits_by_reserved_bytes_and_runs_exclusive_jobs_alone():
    led = DeviceLedger(capacity_bytes=10 * GiB)
    assert led.fits(9 * GiB)
    led.start(0, 6 * GiB)
    assert led.fits(4 * GiB) and not led.fits(5 * GiB)
    assert not led.fits(0, exclusive=True)  # alone means alone, even for a job that reserves nothing
    led.start(1, 4 * GiB)
    assert led.shared == {0, 1}
    assert not led.fits(1)
    assert led.finish(0) is True and led.finish(1) is True
    assert led.fits(0, exclusive=True)
    led.start(2, 0, exclusive=True)
    assert not led.fits(0) and led.finish(2) is False  # it ran alone
    # unknown capacity: reservations are not limited, exclusivity still is
    free = DeviceLedger()
    free.start(0, 500 * GiB)
    assert free.fits(500 * GiB) and not free.fits(0, exclusive=True)


def test_ledger_holder_blocks_the_other_slots_until_it_starts():
    led = DeviceLedger(capacity_bytes=10 * GiB)
    led.start(0, 8 * GiB)
    assert not led.fits(5 * GiB)
    led.holder = 1  # slot 1 holds a 5 GiB job waiting for room
    assert led.blocked_for(2) and not led.blocked_for(1)
    led.finish(0)
    assert led.fits(5 * GiB)
    led.start(1, 5 * GiB)
    assert led.holder is None and not led.blocked_for(2)


@pytest.mark.parametrize("result, expected", [
    ({"status": "runtime_error", "message": "verify: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
      "2.00 GiB"}, True),
    ({"status": "internal_error", "message": "reference failed", "log": ["CUDA_ERROR_OUT_OF_MEMORY in cuMemAlloc"]},
     True),
    ({"status": "runtime_error", "message": "verify: cudaErrorMemoryAllocation"}, True),
    ({"status": "incorrect", "message": "trial 0: out of memory in the comment"}, False),  # not a failure of that kind
    ({"status": "ok", "message": ""}, False),
    ({"status": "runtime_error", "message": "verify: IndexError: index 5 is out of bounds"}, False),
])
def test_out_of_memory_reads_failing_results_only(result, expected):
    assert out_of_memory(result) is expected


def test_task_footprints_keep_the_largest_peak_per_task_within_a_bound():
    fp = TaskFootprints(max_tasks=2)
    a = task_footprint_key({"id": "a", "reference": "x", "shape_params": {"n": 1}})
    b = task_footprint_key({"id": "a", "reference": "x", "shape_params": {"n": 2}})
    c = task_footprint_key({"id": "c", "reference": "y"})
    assert len({a, b, c}) == 3
    fp.record(a, 3 * GiB)
    fp.record(a, 2 * GiB)
    fp.record(b, 0)  # the CPU backend measures nothing: not recorded
    assert fp.get(a) == 3 * GiB and fp.get(b) == 0 and len(fp) == 1
    fp.record(b, 1)
    fp.record(c, 1)  # a is the least recently used: dropped
    assert len(fp) == 2 and fp.get(a) == 0
    with pytest.raises(ValueError, match="max_tasks"):
        TaskFootprints(0)


_OOM_SPOOF = '''import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.1 GiB total)")
'''


@pytest.mark.slow
def test_out_of_memory_beside_another_job_is_evaluated_again_alone_once(tmp_path):
    sols = corpus()
    spoof_files = dict(sols["fast"].files, **{"model_new.py": _OOM_SPOOF})
    node = start_node(tmp_path, "workers=2", "queue_max=8")
    try:
        with SandboxClient([node.endpoint], client_id="test-admission") as client:
            assert client.wait_for_nodes(timeout_s=90)
            wait_until(lambda: node_status(client, node.endpoint)["workers_ready"] == 2, 90, "both workers up")
            # alone on the node: its out-of-memory answer stands, no re-run
            alone = client.run(job(sols["fast"], files=spoof_files, salt=uuid.uuid4().hex))
            assert alone.status == "runtime_error" and alone.result["reward"] == -1
            assert "out of memory" in alone.result["message"]
            assert not any("evaluated again alone" in x for x in alone.result["log"])
            assert node_status(client, node.endpoint)["counts"].get("rejected_oom_rerun", 0) == 0
            # beside a hanging job (answered timeout after trial_timeout_s): evaluated again alone, once, after
            # the hanging job ended; the second answer is final
            hang_fut = client.submit(job(sols["hang"], salt=uuid.uuid4().hex, settings=dict(QUICK, trial_timeout_s=8.0)))
            hang_done: list[float] = []
            hang_fut.add_done_callback(lambda _: hang_done.append(time.monotonic()))
            wait_until(lambda: node_status(client, node.endpoint)["running"] >= 1, 30, "the hanging job running")
            spoof = client.run(job(sols["fast"], files=spoof_files, salt=uuid.uuid4().hex))
            spoof_done = time.monotonic()
            hang = hang_fut.result(timeout=300)
            # alone means after the hanging job: its second run could not start while that one ran
            assert hang_done and hang_done[0] <= spoof_done
            assert spoof.status == "runtime_error" and spoof.result["reward"] == -1
            notes = [x for x in spoof.result["log"] if "evaluated again alone" in x]
            assert len(notes) == 1 and "out of memory" in notes[0], spoof.result["log"]
            assert hang.status == "timeout"
            # heartbeats carry the counters: wait for the one that has both answers
            counts = wait_until(lambda: (c := node_status(client, node.endpoint)["counts"]).get("jobs_timeout")
                                and c.get("jobs_runtime_error", 0) >= 2 and c, 10, "both answers in the counters")
            assert counts.get("rejected_oom_rerun") == 1 and counts["jobs_runtime_error"] == 2
    finally:
        node.stop()
