"""`cuda-agent sandbox stress` against a real CPU node: a rate sweep through the command line (reports written,
the step past capacity is found broken, latency counted from the intended send time), and a closed-loop run whose
figures agree with Little's law."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from sandbox.client import SandboxClient
from sandbox.stress import StressConfig, broken, SweepConfig, load_corpus, run_load, DEFAULT_CORPUS

from _svc_helpers import QUICK, TASK, start_node


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    n = start_node(tmp_path_factory.mktemp("stress-node"))
    yield n
    n.stop()


@pytest.mark.slow
def test_stress_sweep_command_finds_the_step_past_capacity(node, tmp_path):
    out = tmp_path / "report"
    settings = [f"--setting={k}={json.dumps(v)}" for k, v in QUICK.items()]
    cmd = [sys.executable, "-m", "cuda_agent.cli", "sandbox", "stress", "--endpoint", node.endpoint, "--task", TASK,
           "--mix", "fast=3,wrong=1", "--sweep", "--rates", "0.25,8", "--step-duration", "4", "--out", str(out),
           "--deadline", "300", *settings]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=400)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    rep = json.loads((out / "stress.json").read_text())
    assert (out / "stress.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (out / "stress.md").read_text()
    assert "Knee:" in md and "Little ratio" in md and "evaluations/hour" in md
    steps = rep["sweep"]["steps"]
    assert [s["offered_rate_per_s"] for s in steps] == [0.25, 8.0]
    assert [s["jobs_sent"] for s in steps] == [1, 32]
    hot = steps[1]
    assert hot["broken"], "32 jobs offered in 4 s to one CPU worker must be past its capacity"
    assert rep["sweep"]["knee_rate_per_s"] in (None, 0.25) and rep["sweep"]["broken_at_rate_per_s"] in (0.25, 8.0)
    recs = sorted(hot["records"], key=lambda r: r["index"])
    assert all(r["status"] in ("ok", "incorrect") for r in recs)
    # open loop: the sender kept to the schedule while the node fell behind, and the queueing shows in the latency
    assert max(r["sent_s"] - r["intended_s"] for r in recs) < 0.5
    assert all(r["latency_ms"] >= r["stage_ms"]["node"] for r in recs)
    assert recs[-1]["latency_ms"] > recs[0]["latency_ms"] + 1000
    assert hot["stage_ms"]["queue"]["max_ms"] > 1000
    assert hot["latency_ms"]["p99_ms"] >= hot["latency_ms"]["p50_ms"] > 0


def test_closed_loop_run_agrees_with_littles_law(node):
    corpus = load_corpus(DEFAULT_CORPUS, "cpu", None, [TASK])
    cfg = StressConfig(mode="concurrency", concurrency=2, jobs=6, mix={"fast": 1, "wrong": 1, "crash": 1},
                       settings=dict(QUICK), deadline_s=300)
    with SandboxClient([node.endpoint]) as c:
        assert c.wait_for_nodes(timeout_s=60)
        run = run_load(c, corpus, cfg)
    assert run["results"] == 6 and not run["errors"]
    kinds = run["status_by_kind"]
    assert set(kinds.get("fast", {})) <= {"ok"} and set(kinds.get("wrong", {})) <= {"incorrect"}
    assert set(kinds.get("crash", {})) <= {"runtime_error"}
    lt = run["little"]
    assert 1.2 <= lt["mean_in_flight"] <= 2.05
    assert 0.75 <= lt["ratio"] <= 1.25, lt
    assert run["nodes"]["worker_restarts"] == 0 and 0 < run["nodes"]["worker_busy_fraction"] <= 1.0
    assert run["evaluations_per_hour"] == pytest.approx(run["throughput_per_s"] * 3600)


def test_knee_rules():
    first = {"latency_ms": {"p99_ms": 1000.0, "count": 5}, "jobs_sent": 5, "errors": {}, "offered_rate_per_s": 0.5,
             "throughput_per_s": 0.5}
    sw = SweepConfig()
    assert broken(first, first, sw) == []
    slow = dict(first, latency_ms={"p99_ms": 3500.0, "count": 5})
    assert any("p99" in w for w in broken(slow, first, sw))
    lossy = dict(first, errors={"timeout": 1})
    assert any("errors" in w for w in broken(lossy, first, sw))
    behind = dict(first, offered_rate_per_s=2.0)
    assert any("throughput" in w for w in broken(behind, first, sw))
    assert SweepConfig(start_rate_per_s=0.5, factor=2, steps=3).rate_list() == [0.5, 1.0, 2.0]
