"""Stages 1 (single-turn PPO) and 4 (multi-turn PPO), driver side: start the stage's learner process and the actor
processes under the supervisor, mirror the learner's per-update metrics into the run's metrics (kind "train" and
"rollout") and the progress bar, evaluate the exported snapshots every `eval.every_updates` updates, and stop the
actors when the learner has finished its updates.

    learner   python -m cuda_agent.ppo_learner   (learner.service.LearnerService: trajectory receiver + weights
              publisher on loopback ports)
    actor-i   python -m actors.cli run CONFIG --model POLICY --tasks RUN/tasks/rollout.jsonl --sandbox NODE
              trajectories_endpoint=... weights_endpoint=...   (restarted when it dies)

A learner that crashes is restarted too and resumes from its checkpoint; the actors keep their unacknowledged
trajectories and deliver them to the new learner.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

from cuda_agent.config import to_yaml


def actor_config(driver, stage: str):
    """The ActorConfig of this stage's actors (the run's `actor` section with the stage's agent settings)."""
    cfg = driver.cfg
    spec = getattr(cfg.stages, stage)
    a = dataclasses.replace(cfg.actor)
    a.agent = dataclasses.replace(cfg.actor.agent, mode="single_turn" if stage == "single_turn_ppo" else "multi_turn",
                                  max_turns=1 if stage == "single_turn_ppo" else spec.max_turns,
                                  max_new_tokens_per_turn=spec.max_new_tokens_per_turn,
                                  max_context_tokens=spec.max_context_tokens, temperature=spec.temperature,
                                  solution_format=driver.fmt,
                                  min_new_tokens_per_turn=min(cfg.actor.agent.min_new_tokens_per_turn,
                                                              spec.max_new_tokens_per_turn))
    a.max_cache_len = spec.max_context_tokens
    if a.episodes_per_version is None:  # each actor's share of a batch: sampling stays one batch ahead of the learner
        a.episodes_per_version = cfg.episodes_per_actor(spec)
    if a.episodes_per_version > 0:  # the share is one batch's, set here or by the user
        # weights reach the actors every K updates: a version then stands for K batches, all sampled on it
        a.versions_ahead += cfg.learner.publish_every_updates - 1
    a.model_dtype, a.attention_impl = cfg.model.dtype, cfg.model.attention_impl  # the learner's numerics
    return a


def learner_service_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("learner.service") is not None


def run(driver, stage: str, st: dict) -> bool:
    """Run one PPO stage; returns whether the policy changed. Raises Interrupted on Ctrl-C (after the learner
    wrote its checkpoint), RuntimeError when the learner fails for good. Without the learner service in the
    checkout the stage is recorded as not wired and skipped."""
    if not learner_service_available():
        st.update(status="not_wired", note="the learner service (learner/service.py) is not in this checkout: "
                                           "PPO stages cannot run")
        driver.metrics.log("stage", stage, int(driver.state.get("global_step", 0)), event="not_wired")
        return False
    from cuda_agent.services import REPO_ROOT, child_env, free_port
    from cuda_agent.supervisor import ProcessSpec, tail
    from cuda_agent.train import Interrupted, JsonlTail, _read_json

    cfg = driver.cfg
    spec = getattr(cfg.stages, stage)
    rd = driver.run_dir
    sup = driver.sup
    sv = cfg.supervision
    work = rd.learner_dir(stage)
    work.mkdir(parents=True, exist_ok=True)
    out = rd.policy_dir(stage)
    traj_ep, weights_ep = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    ready = work / "ready.json"
    learner_name = f"learner-{stage}"
    argv = [sys.executable, "-m", "cuda_agent.ppo_learner", "--run-dir", str(rd.root), "--stage", stage,
            "--init", str(driver.state["policy"]), "--out", str(out), "--trajectories", traj_ep,
            "--weights", weights_ep, "--export-every", str(cfg.eval.every_updates)]
    tailer = JsonlTail(work / "metrics" / "metrics.jsonl")  # made before the learner writes to it
    if tailer.path.exists():  # a resumed stage: what the file holds was mirrored before
        tailer.offset = tailer.path.stat().st_size
    learner = sup.start(ProcessSpec(learner_name, argv, env=child_env(jax_memory_fraction=cfg.jax_memory_fraction),
                                    cwd=str(REPO_ROOT), restart=True,
                                    max_restarts=sv.max_restarts, backoff_s=sv.backoff_s,
                                    stop_timeout_s=sv.stop_timeout_s, ready_file=str(ready)))
    bar = driver._bar(stage.replace("_", " "), spec.updates)
    driver._bar_update(bar, 0, "learner starting")
    driver._wait_ready(learner_name, sv.ready_timeout_s)

    # actors
    acfg = actor_config(driver, stage)
    actor_yaml = work / "actor.yaml"
    actor_yaml.write_text(to_yaml(acfg))
    tasks = rd / "tasks" / "rollout.jsonl"
    actors = []
    for i in range(cfg.actors):
        name = f"actor-{stage}-{i}"
        a_argv = [sys.executable, "-m", "actors.cli", "run", "--config", str(actor_yaml),
                  "--set", f"trajectories_endpoint={traj_ep}", "--set", f"weights_endpoint={weights_ep}",
                  "--set", f"actor_id={name}", "--set", f"seed={cfg.seed * 1000 + i}",
                  "--model", str(driver.state["policy"]), "--sandbox", driver.sandbox_endpoint, "--tasks", str(tasks),
                  "--summary-out", str(work / f"{name}.summary.json")]
        sup.start(ProcessSpec(name, a_argv, env=child_env(), cwd=str(REPO_ROOT), restart=True,
                              restart_on_exit_0=True, max_restarts=sv.max_restarts, backoff_s=sv.backoff_s,
                              stop_timeout_s=5.0))  # at the stage's end their running episodes are of no use
        actors.append(name)
    driver._bar_update(bar, 0, f"{len(actors)} actor(s) sampling")

    base = int(driver.state.get("global_step", 0))
    last = 0
    pending_eval = None
    try:
        while True:
            for rec in tailer.read():
                last = max(last, int(rec.get("step", 0)))
                step = base + last
                fields = {k: v for k, v in rec.items() if k not in ("step", "time", "export")}
                driver.metrics.log("train", stage, step, **fields)
                roll = {"reward_mean": rec.get("reward/mean"), "pass_rate": rec.get("rollout/pass_rate"),
                        "episodes": rec.get("rollout/episodes"), "episodes_per_s": rec.get("rollout/episodes_per_s"),
                        "speedup_eager_geomean": rec.get("rollout/speedup_eager_geomean")}
                driver.metrics.log("rollout", stage, step, **{k: v for k, v in roll.items() if v is not None})
                stats = (f"reward {roll['reward_mean'] or 0:+.2f}  pass {roll['pass_rate'] or 0:.0%}  "
                         f"{roll['episodes_per_s'] or 0:.2f} episodes/s")
                driver._bar_update(bar, last, stats)
                if rec.get("export") and pending_eval is None:
                    pending_eval = driver._eval_start(f"{stage}-u{last}", rec["export"], updates=step)
                elif rec.get("export"):
                    driver.metrics.log("event", stage, step, name="eval", state="skipped",
                                       message=f"snapshot at update {last}: the previous evaluation still runs")
            if pending_eval is not None and driver._eval_poll(pending_eval):
                driver._eval_finish(pending_eval)
                pending_eval = None
            if actors and all(sup.state(a) == "failed" for a in actors):
                mp = sup.children[actors[0]]
                sup.stop(learner_name)
                raise RuntimeError(f"every actor of {stage} failed (gave up after {mp.restarts} restarts); log "
                                   f"{mp.log_path}:\n{tail(mp.log_path, 15)}")
            state = learner.state
            if state in ("finished", "stopped", "failed") or (state == "crashed" and not learner.spec.restart):
                break
            if driver.stop.is_set():
                sup.stop_all(actors)
                sup.stop(learner_name)  # SIGTERM: the learner writes its checkpoint
                raise Interrupted()
            time.sleep(0.5)
    except BaseException:
        if pending_eval is not None:
            sup.stop(pending_eval["name"])
        raise
    finally:  # the learner is done: the actors' running episodes are of no use, cancel them (two signals)
        sup.stop_all(actors, signals=2)
    if pending_eval is not None:  # a periodic evaluation still running when the learner finished
        driver._eval_wait(pending_eval)
        driver._eval_finish(pending_eval)
    for rec in tailer.read():
        last = max(last, int(rec.get("step", 0)))
        driver.metrics.log("train", stage, base + last,
                           **{k: v for k, v in rec.items() if k not in ("step", "time", "export")})
    rc = learner.returncode
    if rc == 3:
        raise Interrupted()
    if rc != 0:
        raise RuntimeError(f"{learner_name} failed (exit {rc}, state {learner.state}); log {learner.log_path}:\n"
                           f"{tail(learner.log_path, 15)}")
    res = _read_json(work / "result.json")
    driver.state["global_step"] = base + int(res.get("updates", last))
    driver.state["policy"] = str(out)
    restarts = {a: sup.restarts(a) for a in actors}
    st.update(status="done", updates=res.get("updates"), note=f"{res.get('updates')} updates, {res.get('episodes')} "
              f"episodes ({res.get('status')}); actor restarts {sum(restarts.values())}")
    driver._bar_update(bar, stats=f"done: {res.get('updates')} updates, {res.get('episodes')} episodes", done=True)
    return int(res.get("updates", 0)) > 0
