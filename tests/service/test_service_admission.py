"""Device-memory admission of the sandbox node (sandbox.service_admission): the ledger's decisions, the
out-of-memory test on results, the learned task footprints; and on a real two-worker node (CPU backend) that a
candidate's own out-of-memory text earns it no second evaluation."""

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
    led.finish(0)
    led.finish(1)
    assert not led.shared and not led.reserved
    assert led.fits(0, exclusive=True)
    led.start(2, 0, exclusive=True)
    assert not led.fits(0) and 2 not in led.shared  # it runs alone
    led.finish(2)
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


_OOM_TEXT = "verify: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"


@pytest.mark.parametrize("result, expected", [
    ({"status": "runtime_error", "message": _OOM_TEXT, "device_free_fraction": 0.03}, True),
    ({"status": "load_error", "message": "load: " + _OOM_TEXT, "device_free_fraction": 0.0}, True),
    ({"status": "internal_error", "message": "reference failed", "log": ["CUDA_ERROR_OUT_OF_MEMORY in cuMemAlloc"],
      "device_free_fraction": 0.1}, True),
    ({"status": "runtime_error", "message": "verify: cudaErrorMemoryAllocation", "device_free_fraction": 0.2}, True),
    # the text is the candidate's to write: without the trusted side's low reading it decides nothing
    ({"status": "runtime_error", "message": _OOM_TEXT, "device_free_fraction": 0.6}, False),
    ({"status": "runtime_error", "message": _OOM_TEXT, "device_free_fraction": -1.0}, False),
    ({"status": "runtime_error", "message": _OOM_TEXT}, False),
    ({"status": "incorrect", "message": "trial 0: out of memory in the comment", "device_free_fraction": 0.0}, False),
    ({"status": "ok", "message": "", "device_free_fraction": 0.0}, False),
    ({"status": "runtime_error", "message": "verify: IndexError: index 5 is out of bounds", "device_free_fraction": 0.0},
     False),
])
def test_out_of_memory_needs_a_failure_its_text_and_the_trusted_reading(result, expected):
    assert out_of_memory(result, 0.25) is expected


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
def test_a_candidates_own_out_of_memory_text_gets_no_second_evaluation(tmp_path):
    """On a real two-worker node (CPU backend): a candidate that raises a CUDA out-of-memory error, alone or beside
    a hanging job, is answered runtime_error once: the CPU backend has no out-of-memory re-run, and its text
    carries no trusted evidence (the GPU side of the rule: test_service_admission_node.py)."""
    sols = corpus()
    spoof_files = dict(sols["fast"].files, **{"model_new.py": _OOM_SPOOF})
    node = start_node(tmp_path, "workers=2", "queue_max=8")
    try:
        with SandboxClient([node.endpoint], client_id="test-admission") as client:
            assert client.wait_for_nodes(timeout_s=90)
            wait_until(lambda: node_status(client, node.endpoint)["workers_ready"] == 2, 90, "both workers up")
            alone = client.run(job(sols["fast"], files=spoof_files, salt=uuid.uuid4().hex))
            assert alone.status == "runtime_error" and alone.result["reward"] == -1
            assert "out of memory" in alone.result["message"]
            hang_fut = client.submit(job(sols["hang"], salt=uuid.uuid4().hex, settings=dict(QUICK, trial_timeout_s=8.0)))
            wait_until(lambda: node_status(client, node.endpoint)["running"] >= 1, 30, "the hanging job running")
            spoof = client.run(job(sols["fast"], files=spoof_files, salt=uuid.uuid4().hex))
            assert spoof.status == "runtime_error" and spoof.result["reward"] == -1
            assert spoof.result["device_free_fraction"] == -1.0
            assert not any("evaluated again alone" in x for x in spoof.result["log"]), spoof.result["log"]
            assert hang_fut.result(timeout=300).status == "timeout"
            counts = wait_until(lambda: (c := node_status(client, node.endpoint)["counts"]).get("jobs_timeout")
                                and c.get("jobs_runtime_error", 0) >= 2 and c, 10, "the answers in the counters")
            assert counts.get("rejected_oom_rerun", 0) == 0 and counts["jobs_runtime_error"] == 2
    finally:
        node.stop()
