"""Hostile solutions in the mix (tests/service/data/hostile: kill -9 -1, leftover processes, writes outside the
workspace, network probes, a memory hog, a torch fallback, a forbidden symbol) do not change the results of the
other jobs: the same clean jobs give the same statuses and reward levels alone and mixed with them, on a node
with two workers so hostile and clean candidates run side by side."""

from __future__ import annotations

import concurrent.futures
import os
import uuid
from pathlib import Path

import pytest

from sandbox.client import SandboxClient

from _svc_helpers import corpus, is_root, job, nobody_processes, start_node, wait_until

CLEAN = ("fast", "slow", "wrong", "crash")
MARKER = Path("/tmp/cuda-agent-hostile-marker")


def _run(client: SandboxClient, sols: dict, names: list[str]) -> dict[str, tuple[str, bool]]:
    salt = uuid.uuid4().hex  # fresh content keys: every job is evaluated, none answered from memory
    futs = {n: client.submit(job(sols[n], salt=salt)) for n in names}
    out = {}
    for n, f in futs.items():
        r = f.result(timeout=400)
        out[n] = (r.status, r.result["reward"] >= 0)
    return out


@pytest.mark.slow
@pytest.mark.skipif(not is_root(), reason="namespace isolation needs root (CI runs as root)")
def test_hostile_solutions_do_not_change_other_results(tmp_path):
    MARKER.unlink(missing_ok=True)
    sols = corpus(hostile=True)
    hostile = sorted(n for n in sols if n.startswith("hostile/"))
    assert len(hostile) >= 6
    node = start_node(tmp_path, "workers=2")
    try:
        with SandboxClient([node.endpoint]) as c:
            assert c.wait_for_nodes(timeout_s=60)
            clean = _run(c, sols, list(CLEAN))
            mixed_names = [n for pair in zip(hostile, list(CLEAN) * 2) for n in pair] + hostile[len(CLEAN) * 2:]
            mixed = _run(c, sols, mixed_names)
            pids = c.nodes()[node.endpoint]["status"]["worker_pids"]
    finally:
        node.stop()
    assert clean == {"fast": ("ok", True), "slow": ("ok", True), "wrong": ("incorrect", False),
                     "crash": ("runtime_error", False)}
    assert {n: mixed[n] for n in CLEAN} == clean
    # the hostile ones were caught or contained, each with its own status
    assert mixed["hostile/torch_fallback"][0] == "forbidden"
    assert mixed["hostile/forbidden_symbol"][0] == "forbidden"
    # the in-process monitor refuses the write before the read-only mount has to (tests/sandbox/test_sandbox_isolation.py
    # checks the mount namespace alone)
    assert mixed["hostile/escape_write"][0] == "forbidden"
    assert not MARKER.exists(), "a candidate wrote outside its workspace"
    # nothing the candidates started outlives them, and no worker was lost
    wait_until(lambda: not [c for c in nobody_processes() if "sleep 100000" in c], 15,
               "the hostile candidates' sleepers to be gone")
    assert "replacing the worker" not in node.log_path.read_text()
    assert len(pids) == 2 and all(pids)
