"""sandbox.prewarm: a task's torch.compile baseline compiled ahead of time is found in inductor's cache by a later
process compiling it the way the trusted worker does (real torch.compile, real processes, a private cache)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tasks.loaders import load_py_file, write_jsonl
from tasks.schema import Task

from sandbox_testlib import CORPUS

REPO = Path(__file__).resolve().parents[2]

BROKEN = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        raise RuntimeError("this reference cannot be built")

    def forward(self, x):
        return x


def get_inputs():
    return [torch.randn(8)]


def get_init_inputs():
    return []
'''

# the trusted worker's path: TaskState from the pristine source, compiled_model on one input set; prints inductor's
# FX graph cache counters of this fresh process
WORKER_SIDE = '''
import json, sys, torch
from torch._dynamo.utils import counters
from sandbox.reference_worker import TaskState
from tasks.loaders import load_jsonl
torch.set_num_threads(1)
task = load_jsonl(sys.argv[1])[0]
st = TaskState(task.reference, task.id, sys.argv[2])
assert st.compiled_model("default", st.to_device(st.make_inputs(7))) is not None, st.compile_error
print(json.dumps(dict(counters["inductor"])))
'''


def _env(cache: Path) -> dict:
    path = os.pathsep.join([str(REPO)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))
    return {**os.environ, "PYTHONPATH": path, "TORCHINDUCTOR_CACHE_DIR": str(cache),
            "TORCHINDUCTOR_COMPILE_THREADS": "1"}


def _worker_counters(tasks: Path, cache: Path, device: str) -> dict:
    p = subprocess.run([sys.executable, "-c", WORKER_SIDE, str(tasks), device], env=_env(cache), capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def _prewarm_then_worker(tmp_path: Path, device: str) -> None:
    task = load_py_file(CORPUS / "elementwise_chain" / "model.py", task_id="elementwise_chain")
    broken = Task(id="broken_ref", name="broken_ref", reference=BROKEN)
    tasks = tmp_path / "tasks.jsonl"
    write_jsonl([broken, task], tasks)
    only = tmp_path / "only.jsonl"
    write_jsonl([task], only)
    node_yaml = tmp_path / "node.yaml"
    node_yaml.write_text("sandbox:\n  backend: cpu\n  cpu_threads: 1\n")

    # control: without a prewarm the worker side compiles from scratch (a miss, no hit) in an empty cache
    cold = _worker_counters(only, tmp_path / "cold-cache", device)
    assert cold.get("fxgraph_cache_miss", 0) >= 1 and cold.get("fxgraph_cache_hit", 0) == 0, cold

    cache = tmp_path / "cache"
    out = tmp_path / "prewarm.jsonl"
    p = subprocess.run([sys.executable, "-m", "sandbox.prewarm", str(node_yaml), str(tasks), str(tasks), "--out",
                        str(out), "--device", device], env=_env(cache), capture_output=True, text=True, timeout=600,
                       cwd=REPO)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = [json.loads(ln) for ln in out.read_text().splitlines()]
    assert len(rows) == 2  # the file given twice: each task once
    by_id = {r["task_id"]: r for r in rows}
    assert by_id["broken_ref"]["status"] == "reference_failed"
    assert "cannot be built" in by_id["broken_ref"]["message"]
    assert by_id["elementwise_chain"]["status"] == "compiled" and by_id["elementwise_chain"]["compile_s"] > 0

    warm = _worker_counters(only, cache, device)
    assert warm.get("fxgraph_cache_hit", 0) >= 1 and warm.get("fxgraph_cache_miss", 0) == 0, warm


def test_prewarmed_baseline_is_a_cache_hit_for_the_worker(tmp_path):
    _prewarm_then_worker(tmp_path, "cpu")


@pytest.mark.gpu
def test_prewarmed_baseline_is_a_cache_hit_for_the_worker_on_cuda(tmp_path):
    """The same on the GPU: inductor's Triton kernels and the FX graph come from the prewarm's cache."""
    _prewarm_then_worker(tmp_path, "cuda:0")


def _prewarm_cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sandbox.prewarm", *args], env=_env(tmp_path / "c"),
                          capture_output=True, text=True, timeout=120, cwd=REPO)


def test_prewarm_bad_input_is_named(tmp_path):
    p = _prewarm_cli(tmp_path, str(tmp_path / "missing.yaml"), str(tmp_path / "none.jsonl"))
    assert p.returncode == 2 and "missing.yaml" in p.stderr, p.stderr
    tasks = tmp_path / "t.jsonl"
    write_jsonl([load_py_file(CORPUS / "elementwise_chain" / "model.py", task_id="ec")], tasks)
    bad_key = tmp_path / "bad.yaml"
    bad_key.write_text("sandbox:\n  cpu_thread: 1\n")
    p = _prewarm_cli(tmp_path, str(bad_key), str(tasks))
    assert p.returncode == 2 and "cpu_thread" in p.stderr, p.stderr
    good = tmp_path / "node.yaml"
    good.write_text("sandbox:\n  backend: cpu\n")
    for device, says in (("gpu", "cpu or cuda:N"), ("cuda:99", "GPU(s)")):
        p = _prewarm_cli(tmp_path, str(good), str(tasks), "--device", device)
        assert p.returncode == 2 and says in p.stderr, (device, p.stderr)
    # a reference whose forward raises is the reference's failure, not torch.compile's
    fwd = Task(id="fwd_broken", name="fwd_broken", reference=BROKEN.replace(
        'raise RuntimeError("this reference cannot be built")', "pass").replace(
        "return x", 'raise ValueError("forward is broken")'))
    write_jsonl([fwd], tasks)
    out = tmp_path / "out.jsonl"
    p = _prewarm_cli(tmp_path, str(good), str(tasks), "--out", str(out))
    assert p.returncode == 0, p.stderr
    row = json.loads(out.read_text())
    assert row["status"] == "reference_failed" and "forward is broken" in row["message"], row
