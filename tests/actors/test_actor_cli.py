"""`cuda-agent actor` as a user runs it, in its own process: `eval` against an OpenAI-compatible endpoint
(the test double) and `run` against a real learner side (weights publisher and trajectory receiver)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from _helpers import KERNEL, MODEL_NEW, call, free_port, make_task, write
from _openai_double import ChatCompletionsDouble
from tasks.loaders import write_jsonl

REPO = Path(__file__).resolve().parents[2]


def cuda_agent(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "cuda_agent.cli", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)


#: `--set` overrides of `cuda-agent actor run` for the tiny model: short turns, small sampler buckets
_TINY_ACTOR_SETS = ("--set", "agent.skill=brief", "--set", "agent.max_turns=2",
                    "--set", "agent.max_new_tokens_per_turn=8", "--set", "agent.min_new_tokens_per_turn=4",
                    "--set", "agent.max_context_tokens=1023", "--set", "sampler_min_batch_bucket=4",
                    "--set", "sampler_min_prompt_bucket=256", "--set", "agent.solution_format=auto")


def _tiny_model_and_task(tokenizer, tmp_path: Path):
    """(ModelConfig, model folder, tasks.jsonl): a tiny model's config.json and tokenizer (weights come from the
    test's publisher), and one task."""
    from learner.hf_checkpoint import config_to_hf
    from learner.model import ModelConfig

    model_dir = tmp_path / "model"
    model_dir.mkdir()
    cfg = ModelConfig.tiny(vocab_size=tokenizer.vocab_size)
    (model_dir / "config.json").write_text(json.dumps(config_to_hf(cfg)))
    tokenizer.save(model_dir / "tokenizer.json")
    tasks = tmp_path / "tasks.jsonl"
    write_jsonl([make_task()], tasks)
    return cfg, model_dir, tasks


def test_actor_help_lists_run_and_eval():
    out = cuda_agent("actor", "--help")
    assert out.returncode == 0 and "run" in out.stdout and "eval" in out.stdout
    bad = cuda_agent("actor", "eval", "--out", "x.jsonl")
    assert bad.returncode != 0 and "give exactly one policy" in bad.stderr + bad.stdout


def test_actor_eval_with_an_openai_endpoint_writes_per_task_results(tokenizer, sandbox_node, tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    write_jsonl([make_task("endpoint", "cli_task")], tasks)
    tok_file = tokenizer.save(tmp_path / "tokenizer.json")
    out = tmp_path / "results.jsonl"
    scripts = {"endpoint": [write("kernels/chain.cpp", KERNEL) + "\n" + write("model_new.py", MODEL_NEW),
                            call("finish")]}
    with ChatCompletionsDouble(scripts) as double:
        os.environ["ACTOR_TEST_KEY"] = "sk-cli"
        try:
            res = cuda_agent("actor", "eval", "--openai-url", double.url, "--openai-model", "m1",
                             "--api-key-env", "ACTOR_TEST_KEY", "--tokenizer", str(tok_file), "--tasks", str(tasks),
                             "--sandbox", sandbox_node.endpoint, "--samples", "2", "--out", str(out),
                             "--set", "agent.solution_format=cpu", "--set", "agent.max_turns=3",
                             "--set", "stages.verify_settings={}")
        finally:
            del os.environ["ACTOR_TEST_KEY"]
    assert res.returncode == 0, res.stderr[-3000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 2 and {r["task_id"] for r in rows} == {"cli_task"}
    assert all(r["status"] == "finished" and r["final"]["status"] == "ok" and r["policy"] == "openai:m1"
               for r in rows)
    summary = json.loads(out.with_suffix(".summary.json").read_text())
    assert summary["episodes"] == 2 and summary["by_status"] == {"finished": 2}
    assert {r["auth"] for r in double.requests} == {"Bearer sk-cli"}


@pytest.mark.slow
def test_actor_run_trains_against_a_learner(tokenizer, sandbox_node, tmp_path):
    from actors.weights import random_policy_tensors
    from protocol.trajectory_channel import TrajectoryReceiver
    from protocol.weights_channel import WeightsPublisher

    cfg, model_dir, tasks = _tiny_model_and_task(tokenizer, tmp_path)
    traj_port, weights_port = free_port(), free_port()
    receiver = TrajectoryReceiver(f"tcp://127.0.0.1:{traj_port}", tmp_path / "spool").start()
    publisher = WeightsPublisher(f"tcp://127.0.0.1:{weights_port}").start()
    publisher.publish(3, random_policy_tensors(cfg, seed=3, std=0.08))
    summary_file = tmp_path / "summary.json"
    try:
        res = cuda_agent("actor", "run", "--model", str(model_dir), "--sandbox", sandbox_node.endpoint,
                         "--tasks", str(tasks), "--max-episodes", "3", "--summary-out", str(summary_file),
                         "--set", f"trajectories_endpoint=tcp://127.0.0.1:{traj_port}",
                         "--set", f"weights_endpoint=tcp://127.0.0.1:{weights_port}",
                         *_TINY_ACTOR_SETS, "--set", "concurrent_episodes=3", timeout=400)
        assert res.returncode == 0, res.stderr[-3000:]
        trajs, _ = receiver.spool.read(max_records=10)
    finally:
        receiver.close()
        publisher.close()
    assert len(trajs) == 3 and {t.policy_version for t in trajs} == {3}
    assert all(t.loss_mask.sum() > 0 and np.all(t.behaviour_logprobs[t.loss_mask == 0] == 0) for t in trajs)
    summary = json.loads(summary_file.read_text())
    assert summary["episodes"] == 3 and summary["outbox"]["acked"] == 3


@pytest.mark.slow
@pytest.mark.parametrize("learner_gone", [False, True])
def test_actor_run_aborted_with_a_silent_learner_exits_soon_and_writes_its_summary(tokenizer, sandbox_node, tmp_path,
                                                                                   learner_gone):
    """A second signal (the supervisor's stop at a stage's end) cancels the running episodes; the trajectories the
    learner has not acknowledged get a short flush (actors.cli.ABORT_FLUSH_S), not a minute: the supervisor's grace
    period would run out and its SIGKILL lose the actor's summary."""
    import signal
    import time

    import zmq

    from actors.cli import ABORT_FLUSH_S, FLUSH_S
    from actors.weights import random_policy_tensors
    from protocol.weights_channel import WeightsPublisher

    cfg, model_dir, tasks = _tiny_model_and_task(tokenizer, tmp_path)
    traj_port, weights_port = free_port(), free_port()
    ctx = zmq.Context()
    silent = ctx.socket(zmq.ROUTER)  # a hung learner: takes trajectories, never acknowledges one
    silent.bind(f"tcp://127.0.0.1:{traj_port}")
    publisher = WeightsPublisher(f"tcp://127.0.0.1:{weights_port}").start()
    publisher.publish(3, random_policy_tensors(cfg, seed=3, std=0.08))
    summary_file = tmp_path / "summary.json"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen(
        [sys.executable, "-m", "cuda_agent.cli", "actor", "run", "--model", str(model_dir), "--sandbox",
         sandbox_node.endpoint, "--tasks", str(tasks), "--summary-out", str(summary_file),
         "--set", f"trajectories_endpoint=tcp://127.0.0.1:{traj_port}",
         "--set", f"weights_endpoint=tcp://127.0.0.1:{weights_port}",
         *_TINY_ACTOR_SETS, "--set", "concurrent_episodes=2", "--set", "weights_poll_s=0.5"],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=open(tmp_path / "actor.log", "w"))
    try:
        assert silent.poll(300_000), "no trajectory reached the learner's socket in 300 s"
        if learner_gone:  # a stage's end: the learner has exited before the supervisor stops the actors
            publisher.close()
            time.sleep(1.0)  # a weights poll (10 s timeout) is now waiting for the gone publisher
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        proc.wait(FLUSH_S + 30)
        took_s = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
        silent.close(0)
        ctx.term()
        if not learner_gone:
            publisher.close()
    assert proc.returncode == 0, (tmp_path / "actor.log").read_text()[-3000:]
    # the supervisor gives a PPO stage's actors 5 s (ppo_stage: stop_timeout_s=5.0) before its SIGKILL
    assert took_s < 5.0, f"an aborted actor took {took_s:.1f} s to exit (flush {ABORT_FLUSH_S} s)"
    summary = json.loads(summary_file.read_text())
    assert summary["outbox"]["put"] >= 1 and summary["outbox"].get("acked", 0) == 0


def test_flush_after_an_abort_that_lands_during_it_waits_only_the_short_flush():
    """The supervisor's second signal can arrive while the actor already waits out its (60 s) flush."""
    import threading
    import time

    from actors.cli import ABORT_FLUSH_S, _flush

    class SilentOutbox:  # a learner that never acknowledges
        def flush(self, timeout_s=None):
            time.sleep(timeout_s or 0)
            return False

    abort = threading.Event()
    threading.Timer(0.5, abort.set).start()
    t0 = time.monotonic()
    assert not _flush(SilentOutbox(), abort)
    assert 0.5 + ABORT_FLUSH_S - 0.2 < time.monotonic() - t0 < 0.5 + ABORT_FLUSH_S + 1.0
