"""Two learner processes joined by jax.distributed on loopback (CPU, 2 devices each) train on one global mesh,
agree with each other and with a single process holding all 4 devices, and write one checkpoint together that a
single process restores."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

WORKER = Path(__file__).with_name("_multihost_worker.py")
REPO = Path(__file__).resolve().parents[2]

HANG_S = 420
"""A pair took 59-289 s in 7 runs by hand on the 2-core box (the slowest beside another training run). CI saw one
hang of more than 900 s (2026-12-04), not reproduced here: the worker's faulthandler then shows where, and a pure
hang runs once more."""


def _env(devices: int) -> dict:
    env = dict(os.environ)
    env.update(JAX_PLATFORMS="cpu", XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
               MULTIHOST_HANG_S=str(HANG_S),
               PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""))
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_pair(tmp_path: Path) -> list[tuple[int, str]]:
    """Both processes of one distributed run: [(exit status, output)]. A process stuck longer than
    MULTIHOST_HANG_S prints every thread's stack and exits 1 (faulthandler, in the worker)."""
    coord = f"127.0.0.1:{_free_port()}"
    # output to files, not pipes: communicate() on one process leaves the other's pipe undrained, and a worker
    # blocked writing to a full pipe stalls its peer in the next collective (a hang made by the test itself)
    logs = [tmp_path / f"worker_2_{pid}.log" for pid in (0, 1)]
    procs = []
    for pid, log in zip((0, 1), logs):
        with open(log, "w") as f:
            procs.append(subprocess.Popen([sys.executable, str(WORKER), str(tmp_path), "2", str(pid), coord],
                                          env=_env(2), stdout=f, stderr=subprocess.STDOUT))
    try:
        for p in procs:
            p.wait(timeout=HANG_S + 120)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return [(p.returncode, log.read_text()) for p, log in zip(procs, logs)]


@pytest.mark.slow
@pytest.mark.timeout(1800)  # several JAX processes compiling: slow on a loaded 2-core box
def test_two_learner_processes_on_loopback(tmp_path):
    pair = _run_pair(tmp_path)
    hung = [out for rc, out in pair if rc != 0 and "Timeout (0:" in out]
    # only a pure hang runs again (its stacks go to the warnings summary); a Python traceback in either process is
    # a real failure, reported as one
    if hung and not any("Traceback (most recent call last)" in out for _, out in pair):
        warnings.warn("a distributed pair hung; the stuck process's stacks:\n" + hung[0][-4000:])
        for f in tmp_path.glob("metrics_2_*.json"):
            f.unlink()
        shutil.rmtree(tmp_path / "ckpt_2", ignore_errors=True)
        pair = _run_pair(tmp_path)
    for rc, out in pair:
        assert rc == 0, out[-3000:]
    single = subprocess.run([sys.executable, str(WORKER), str(tmp_path), "1", "0", "-"], env=_env(4),
                            capture_output=True, text=True, timeout=900)
    assert single.returncode == 0, single.stderr[-3000:]

    r0, r1, ref = (json.loads((tmp_path / f"metrics_{n}_{i}.json").read_text()) for n, i in ((2, 0), (2, 1), (1, 0)))
    assert (r0["process_count"], r0["devices"], r0["local_devices"]) == (2, 4, 2)
    assert (ref["process_count"], ref["devices"]) == (1, 4)
    assert r0["history"] == r1["history"]  # one global computation: every process reports the same numbers
    for got, want in zip(r0["history"], ref["history"]):
        for k, v in want.items():
            assert got[k] == pytest.approx(v, rel=1e-4, abs=1e-6), k
    # the checkpoint both processes wrote restores in one process, onto its own mesh
    assert ref["restored_meta_update"] == 2
    assert ref["restored_max_param_diff"] < 1e-4
