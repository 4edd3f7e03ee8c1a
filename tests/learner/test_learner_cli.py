"""`cuda-agent learner serve` as a real process: serves weights, trains on trajectories sent over ZeroMQ, and on
SIGTERM writes its checkpoint and exits with code 3."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from _tiny_models import make_policy  # noqa: E402

from learner import synthetic  # noqa: E402
from learner import train_step as ts  # noqa: E402
from learner.config import OptimizerConfig, PPOConfig  # noqa: E402
from learner.hf_checkpoint import save_pretrained  # noqa: E402
from learner.metrics import read_jsonl  # noqa: E402
from protocol.trajectory_channel import TrajectoryOutbox  # noqa: E402
from protocol.weights_channel import WeightsFetcher  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def _wait_for(path: Path, proc: subprocess.Popen, timeout_s: float = 900) -> None:
    t0 = time.monotonic()
    while not path.exists():
        assert proc.poll() is None, proc.stdout.read()[-3000:]
        assert time.monotonic() - t0 < timeout_s, f"no {path}"
        time.sleep(0.2)


@pytest.mark.slow
@pytest.mark.timeout(1800)  # several JAX processes compiling: slow on a loaded 2-core box
def test_serve_trains_and_checkpoints_on_sigterm(tmp_path):
    init = tmp_path / "policy"
    model = make_policy()
    save_pretrained(model, init, dtype="float32")
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "cuda_agent.cli", "learner", "serve", "--init", str(init), "--run-dir", str(run),
           "--trajectories", "tcp://127.0.0.1:*", "--weights", "tcp://127.0.0.1:*",
           "--set", "batch_trajectories=8", "--set", "buffer_capacity=16", "--set", "max_seq_len=16",
           "--set", "ppo.minibatch_size=4", "--set", "ppo.microbatch_size=4", "--set", "ppo.logits_chunk_size=0",
           "--set", "mesh.fsdp=1", "--set", "checkpoint.every_updates=100"]
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        _wait_for(run / "ready.json", proc)
        ready = json.loads((run / "ready.json").read_text())
        with WeightsFetcher(ready["weights"], actor_id="cli-test") as f:
            assert f.fetch(timeout_s=60).version == 0
        policy = ts.create_train_state(model, OptimizerConfig(), PPOConfig())
        rollout, reward = synthetic.sample_rollout(policy, jax.random.key(0), 8)
        with TrajectoryOutbox(ready["trajectories"], actor_id="cli-test") as out:
            for t in synthetic.to_trajectories(rollout, reward, policy_version=0):
                out.put(t)
            assert out.flush(timeout_s=120)
        _wait_for(run / "metrics" / "metrics.jsonl", proc)
        t0 = time.monotonic()
        while not read_jsonl(run / "metrics" / "metrics.jsonl"):
            assert time.monotonic() - t0 < 120
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        out_text, _ = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 3, out_text[-3000:]
    rows = read_jsonl(run / "metrics" / "metrics.jsonl")
    assert rows[0]["learner/update"] == 1 and rows[0]["reward/count"] == 8
    assert (run / "checkpoints" / "1").is_dir()  # written on SIGTERM (the periodic one is every 100 updates)
    assert (run / "learner_config.yaml").read_text().count("batch_trajectories: 8") == 1


def test_keys_command_and_serve_refuses_an_unauthenticated_bind_beyond_loopback(tmp_path):
    from typer.testing import CliRunner

    from learner.cli import app

    runner = CliRunner()
    r = runner.invoke(app, ["keys", str(tmp_path / "keys"), "--actors", "2"])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "keys" / "server.key_secret").is_file()
    assert sorted(p.name for p in (tmp_path / "keys" / "clients").iterdir()) == ["actor0.key", "actor1.key"]
    assert "learner_curve_secret_key=" in r.output and "--curve-authorized-keys" in r.output
    # the defaults bind tcp://*:5555 / :5556: without keys it stops with a usage error before loading a model
    r = runner.invoke(app, ["serve", "--init", str(tmp_path / "no-policy"), "--run-dir", str(tmp_path / "run")])
    text = " ".join(r.output.replace("│", " ").split())  # rich's error box wraps lines
    assert r.exit_code == 2 and "tcp://*:5555 beyond loopback needs CURVE keys" in text, r.output
    assert not (tmp_path / "run").exists()
