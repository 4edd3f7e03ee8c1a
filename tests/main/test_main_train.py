"""`cuda-agent train` end to end with the smoke preset: real processes (sandbox node, stage workers, learner service,
actor, evaluations) on loopback, the CPU backend. One run goes through every stage while its sandbox node and
later its actor are SIGKILLed (the supervisor restarts them and the run goes on); another is interrupted with
Ctrl-C (SIGINT) during the warm start and resumed from its checkpoint. Nothing here asserts timing."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _train(args, **kw):
    return subprocess.Popen([sys.executable, "-m", "cuda_agent.cli", "train", "--quiet", *args], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


def _state(run: Path) -> dict:
    try:
        return json.loads((run / "state.json").read_text())
    except (OSError, ValueError):
        return {}


def _records(run: Path) -> list[dict]:
    out = []
    for line in (run / "metrics.jsonl").read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out


def _wait(cond, proc, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return
        if proc.poll() is not None:
            raise AssertionError(f"train exited ({proc.returncode}) before {what}:\n{proc.stdout.read()[-4000:]}")
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def _actor_pid(config_path: str) -> int | None:
    """pid of the actor process started with this config file (its own process group), if it runs."""
    import psutil

    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = p.info["cmdline"] or []
        if "actors.cli" in cmd and config_path in cmd:
            return p.info["pid"]
    return None


def _sane_eval(m: dict) -> None:
    for k in ("pass_rate", "faster_than_eager", "faster_than_compile", "pass_at_n"):
        assert 0.0 <= m[k] <= 1.0, (k, m[k])
    assert -1.0 <= m["mean_reward"] <= 3.0
    assert m["samples"] >= 1
    for k in ("geomean_speedup_eager", "geomean_speedup_compile"):
        assert m[k] is None or (m[k] > 0 and math.isfinite(m[k]))


@pytest.mark.slow
@pytest.mark.timeout(1800)  # the whole smoke run (several processes compiling): slow on a loaded 2-core box
def test_smoke_run_all_stages_survives_a_sandbox_kill_and_writes_a_report(tmp_path):
    run = tmp_path / "run"
    proc = _train(["--preset", "smoke", "--run-dir", str(run)])
    try:
        # once the PPO warm-up is under way, SIGKILL the sandbox node with its workers
        _wait(lambda: _state(run).get("current_stage") == "single_turn_ppo", proc, 900, "stage single_turn_ppo")
        info = json.loads((run / "sandbox.ready").read_text())
        os.killpg(int(info["pid"]), signal.SIGKILL)
        # and once the agentic stage has its actor, SIGKILL the actor too
        actor_yaml = str(run / "learner" / "multi_turn_ppo" / "actor.yaml")
        _wait(lambda: _actor_pid(actor_yaml) is not None, proc, 1200, "the multi-turn actor")
        pid = _actor_pid(actor_yaml)
        assert pid is not None
        os.killpg(pid, signal.SIGKILL)  # it is still importing JAX at this point
        out, _ = proc.communicate(timeout=1500)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.wait(120)
    assert proc.returncode == 0, out[-5000:]
    state = _state(run)
    assert state["status"] == "finished"
    stages = state["stages"]
    assert stages["warm_start"]["status"] == "done" and stages["warm_start"]["steps"] >= 1
    ws_result = json.loads((run / "learner" / "warm_start" / "result.json").read_text())
    assert ws_result["warm_start/microbatch_rows"] == 1  # the preset's stages.warm_start.microbatch_rows
    for s in ("single_turn_ppo", "multi_turn_ppo"):
        assert stages[s]["status"] == "done", stages[s]
    for s in ("rft", "value_pretrain"):  # the smoke preset keeps every warm-up trajectory (threshold -1)
        assert stages[s]["status"] == "done", stages[s]
    recs = _records(run)
    # the node was restarted and the run went on
    restarts = [r for r in recs
                if r["kind"] == "event" and r.get("name") == "sandbox" and r.get("state") == "restarting"]
    assert restarts, "no restart of the sandbox node was recorded"
    actor_restarts = [r for r in recs if r["kind"] == "event" and r.get("name") == "actor-multi_turn_ppo-0"
                      and r.get("state") == "restarting"]
    assert actor_restarts, "no restart of the killed actor was recorded"
    # learning figures: SFT loss, PPO updates with rollout statistics, evaluations after each policy change
    assert any("sft/nll" in r for r in recs if r["kind"] == "train" and r["stage"] == "warm_start")
    assert any("ppo/clip_frac" in r for r in recs if r["kind"] == "train" and r["stage"] == "single_turn_ppo")
    rollouts = [r for r in recs if r["kind"] == "rollout"]
    assert {r["stage"] for r in rollouts} == {"single_turn_ppo", "multi_turn_ppo"}
    for r in rollouts:
        assert -1.0 <= r["reward_mean"] <= 3.0 and 0.0 <= r["pass_rate"] <= 1.0 and r["episodes_per_s"] > 0
    evals = {r["tag"]: r for r in recs if r["kind"] == "eval"}
    assert {"after_warm_start", "after_single_turn_ppo", "after_rft", "after_multi_turn_ppo"} <= set(evals)
    # the periodic evaluation of a snapshot exported in the middle of stage 1 (eval.every_updates=1)
    assert "single_turn_ppo-u1" in evals and evals["single_turn_ppo-u1"]["stage"] == "single_turn_ppo"
    for tag in evals:
        _sane_eval(json.loads((run / "eval" / f"{tag}.json").read_text())["metrics"]["overall"])
    # the run folder holds what the report is made of, and the report itself
    assert (run / "config.yaml").read_text().startswith("run_dir:")
    assert any(p.name.startswith("events.out.tfevents") for p in (run / "tb").iterdir())
    assert (run / "policies" / "multi_turn_ppo" / "config.json").exists()
    assert (run / "policies" / "multi_turn_ppo" / "critic" / "config.json").exists()
    assert (run / "trajectories" / "single_turn_ppo.md").read_text().count(">>> policy:") >= 1
    report = (run / "report.md").read_text()
    for png in ("reward", "pass_rate", "speedup"):
        data = (run / "plots" / f"{png}.png").read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
        assert f"plots/{png}.png" in report
    assert "| after_multi_turn_ppo | eval |" in report and "## Per task" in report
    assert "sandbox restarting" in report  # the process events section
    # the smoke preset times no torch.compile baseline (use_compile: false): nothing to prewarm
    assert not (run / "logs" / "prewarm.log").exists()


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_prewarm_compiles_the_evaluation_baselines_beside_the_warm_start(tmp_path):
    run = tmp_path / "run"
    only_warm = ["stages.single_turn_ppo.enabled=false", "stages.multi_turn_ppo.enabled=false",
                 "stages.rft.enabled=false", "stages.value_pretrain.enabled=false", "stages.warm_start.steps=4",
                 "node.sandbox.use_compile=true"]
    proc = _train(["--preset", "smoke", "--run-dir", str(run), *only_warm])
    out, _ = proc.communicate(timeout=1100)
    assert proc.returncode == 0, out[-4000:]
    # the evaluation split first (its tasks are evaluated first), each in the node's env, one result line per task
    ev_ids = [json.loads(ln)["id"] for ln in (run / "tasks" / "eval.jsonl").read_text().splitlines() if ln.strip()]
    prewarm_log = (run / "logs" / "prewarm.log").read_text()
    assert f"prewarm {ev_ids[0]}: compiled" in prewarm_log, prewarm_log[-2000:]
    results = [json.loads(ln) for ln in (run / "prewarm.jsonl").read_text().splitlines()]
    assert results[0]["task_id"] == ev_ids[0] and results[0]["status"] == "compiled"
    assert "--nice 10" in prewarm_log and "sandbox.yaml" in prewarm_log
    assert _state(run)["status"] == "finished"


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_ctrl_c_leaves_a_checkpoint_and_resume_continues(tmp_path):
    run = tmp_path / "run"
    only_warm = ["stages.single_turn_ppo.enabled=false", "stages.multi_turn_ppo.enabled=false",
                 "stages.rft.enabled=false", "stages.value_pretrain.enabled=false", "stages.warm_start.steps=4",
                 "stages.warm_start.time_budget_s=600", "eval.after_stages=false"]
    proc = _train(["--preset", "smoke", "--run-dir", str(run), *only_warm])
    metrics = run / "learner" / "warm_start" / "metrics" / "metrics.jsonl"
    try:
        _wait(lambda: metrics.exists() and '"sft/nll"' in metrics.read_text(), proc, 900, "a warm-start step")
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, out[-4000:]
    state = _state(run)
    assert state["status"] == "interrupted" and state["stages"]["warm_start"]["status"] == "interrupted"
    ckpts = [p for p in (run / "learner" / "warm_start" / "ckpt").iterdir() if p.name.isdigit()]
    assert ckpts, "no checkpoint after Ctrl-C"
    saved_step = max(int(p.name) for p in ckpts)
    assert saved_step >= 1
    assert (run / "report.md").exists()  # the report is written on interrupt too

    proc = _train(["--resume", str(run)])
    out, _ = proc.communicate(timeout=1200)
    assert proc.returncode == 0, out[-4000:]
    state = _state(run)
    assert state["status"] == "finished" and state["stages"]["warm_start"]["status"] == "done"
    assert state["stages"]["warm_start"]["steps"] == 4
    log = (run / "logs" / "stage-warm_start.log").read_text()
    assert f"resumed at step {saved_step}" in log
    steps = [json.loads(x)["step"] for x in metrics.read_text().splitlines()]
    if saved_step < 4:  # the resumed worker went on from the checkpoint: no step trained twice
        assert steps.count(saved_step + 1) == 1
    assert state.get("evals", []) == []  # evaluations were switched off for this run
    assert (run / "policies" / "warm_start" / "config.json").exists() and (run / "report.md").exists()
