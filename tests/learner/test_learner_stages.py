"""The stages on the learner side: warm start on demonstrations, RFT selection, value pre-training, the per-stage
trajectory store on disk, turn limits; and the metrics files."""

from __future__ import annotations

import dataclasses
import json
import os
import sys

import jax
import numpy as np
import pytest
from flax import nnx

sys.path.insert(0, os.path.dirname(__file__))
from _tiny_models import TINY  # noqa: E402

from learner import stages, synthetic  # noqa: E402
from learner import train_step as ts  # noqa: E402
from learner.batch import pack_trajectories  # noqa: E402
from learner.config import OptimizerConfig, PPOConfig  # noqa: E402
from learner.metrics import MetricsLogger, read_jsonl  # noqa: E402
from learner.model import Critic, Transformer  # noqa: E402

CFG = PPOConfig(minibatch_size=16, microbatch_size=16, logits_chunk_size=0, gamma=1.0, lam=1.0)
OPT = OptimizerConfig(lr=1e-2, warmup_steps=0)


def test_warm_start_on_demonstrations_then_rft_and_value_pretraining(tmp_path):
    store = stages.StageStore(tmp_path / "stages")
    # stage 0: supervised warm start on 64 demonstrations (correct two-turn episodes)
    demos = synthetic.demonstrations(64, seed=0)
    assert store.add("warm_start", demos) == 64 and store.add("warm_start", demos[:5]) == 0
    policy = ts.create_train_state(Transformer(TINY, nnx.Rngs(0)), OPT, CFG)
    data, refused = pack_trajectories(store.read_all("warm_start"), max_seq_len=synthetic.LENGTH, rows_multiple=16, pack=False)
    assert not refused and data.num_rows == 64
    rollout0, r0 = synthetic.sample_rollout(policy, jax.random.key(1), 64)
    policy, m = stages.sft_epochs(policy, data, jax.random.key(0), epochs=15)
    rollout, r1 = synthetic.sample_rollout(policy, jax.random.key(2), 64)
    assert float(np.mean(r0)) < 0.2 and float(np.mean(r1)) > 0.6, (np.mean(r0), np.mean(r1), m)

    # the warm-up's trajectories go to disk; RFT keeps those at or above the threshold
    warm = synthetic.to_trajectories(rollout, r1, policy_version=1)
    store.add("single_turn_ppo", warm)
    store.close()
    store = stages.StageStore(tmp_path / "stages")  # after a restart
    back = store.read_all("single_turn_ppo")
    assert [t.episode_id for t in back] == [t.episode_id for t in warm]
    np.testing.assert_array_equal(back[7].tokens, warm[7].tokens)
    kept = stages.rft_select(back, reward_threshold=0.75)
    assert kept and all(t.reward >= 0.75 for t in kept) and len(kept) == int(np.sum(np.asarray(r1) >= 0.75))

    # stage 3: the critic learns the returns of the stored episodes (the warm-up's plus the untrained
    # policy's, so that returns vary: 0 ... 1 by how many of the visible answers are right)
    critic = ts.create_train_state(Critic(TINY, nnx.Rngs(1)), OPT, CFG)
    mixed = back + synthetic.to_trajectories(rollout0, r0, policy_version=0)
    vdata, _ = pack_trajectories(mixed, max_seq_len=synthetic.LENGTH, rows_multiple=16, pack=False)
    _, before = stages.value_pretrain(critic, vdata, jax.random.key(3), steps=0)
    critic2, vm = stages.value_pretrain(critic, vdata, jax.random.key(3), steps=80)
    assert before["value_pretrain/explained_variance"] < 0.05
    assert vm["value_pretrain/explained_variance"] > 0.4, vm
    assert critic2.ppo == CFG and int(critic2.step) == 80
    store.close()


def test_turn_limits_and_stage_names():
    demos = synthetic.demonstrations(3)
    assert stages.turn_count(demos[0]) == 2
    no_stats = dataclasses.replace(demos[0], episode_stats={})
    assert stages.turn_count(no_stats) == 2  # two policy spans in the mask
    ok, over = stages.filter_turn_limit(demos, max_turns=1)
    assert ok == [] and len(over) == 3
    with pytest.raises(ValueError, match="stages are"):
        stages.check_stage("pretraining")
    with pytest.raises(ValueError, match="multiple of the minibatch"):
        list(stages.minibatch_indices(10, 4, jax.random.key(0)))


def test_metrics_jsonl_and_tensorboard(tmp_path):
    with MetricsLogger(tmp_path / "m") as log:
        log.log(1, {"ppo/policy_loss": 0.5, "ppo/approx_kl": float("nan"), "learner/stage": "multi_turn_ppo"},
                histograms={"reward/final": np.array([-1, 0, 3, 3])})
        log.log(2, {"ppo/policy_loss": np.float32(0.25), "reward/count": np.int64(4)})
    rows = read_jsonl(tmp_path / "m" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[0]["ppo/approx_kl"] is None and rows[0]["learner/stage"] == "multi_turn_ppo"
    assert rows[1]["ppo/policy_loss"] == 0.25 and rows[1]["reward/count"] == 4
    events = list((tmp_path / "m" / "tensorboard").glob("events.out.tfevents.*"))
    assert events and events[0].stat().st_size > 100
    json.dumps(rows)  # strict JSON (no NaN)
    off = MetricsLogger(tmp_path / "off", enabled=False)
    off.log(1, {"x": 1.0})
    assert not (tmp_path / "off").exists()


def test_learner_preset_loads_and_overrides():
    from pathlib import Path

    from cuda_agent.config import ConfigError, load_config
    from learner.config import LearnerConfig

    preset = Path(__file__).resolve().parents[2] / "configs" / "learner.yaml"
    cfg = load_config(LearnerConfig, preset, ["ppo.minibatch_size=32", "mesh.fsdp=8"])
    assert cfg.ppo.minibatch_size == 32 and cfg.ppo.grad_accum_steps == 32 and cfg.mesh.fsdp == 8
    assert cfg.max_seq_len == 8192 and cfg.ppo.dual_clip_c == 3.0
    with pytest.raises(ValueError, match="multiple of microbatch_size"):
        load_config(LearnerConfig, preset, ["ppo.microbatch_size=3"])
    with pytest.raises(ConfigError):
        load_config(LearnerConfig, preset, ["ppo.no_such_field=1"])


def test_rft_select_leaves_out_tasks_every_sample_solved():
    """max_task_pass_rate: the correct samples of tasks where at most that fraction of the samples passed; 1 keeps
    every correct sample; a rate outside [0, 1] is refused."""
    from protocol.trajectory import Trajectory

    def traj(i: int, task: str, reward: float) -> Trajectory:
        n = 4
        return Trajectory(episode_id=f"e{i}", task_id=task, actor_id="a", policy_version=1,
                          tokens=np.zeros(n, np.int32), behaviour_logprobs=np.zeros(n, np.float32),
                          loss_mask=np.ones(n, np.uint8), turn_boundaries=np.zeros(1, np.int32), reward=reward)

    rewards = {"easy": [0.0, 1.0, 0.0, 0.0], "mixed": [0.0, -1.0, -1.0, 0.0], "hard": [-1.0] * 4}
    trajs = [traj(10 * k + j, task, r) for k, (task, rs) in enumerate(rewards.items()) for j, r in enumerate(rs)]
    assert [t.episode_id for t in stages.rft_select(trajs, 0.0)] == ["e0", "e1", "e2", "e3", "e10", "e13"]
    assert [t.episode_id for t in stages.rft_select(trajs, 0.0, max_task_pass_rate=0.75)] == ["e10", "e13"]
    assert stages.rft_select(trajs, 0.0, max_task_pass_rate=0.25) == []  # "mixed" passed 2 of 4
    assert [t.episode_id for t in stages.rft_select(trajs, 1.0, max_task_pass_rate=0.5)] == ["e1"]  # 1 of 4 >= 1
    with pytest.raises(ValueError, match="max_task_pass_rate"):
        stages.rft_select(trajs, 0.0, max_task_pass_rate=1.5)


def test_repair_pairs_match_a_failed_and_a_correct_sample_of_one_task():
    """A failed trajectory (a repairable status and its verify observation) paired with a correct one of the same
    task, each failure used once, at most per_task a task; tasks without both kinds, failures with no observation
    or an unrepairable status (forbidden) give none; the choice is seeded."""
    from protocol.trajectory import Trajectory

    def traj(i: int, task: str, reward: float, status: str, obs: str = "verify: INCORRECT ...") -> Trajectory:
        n = 4
        details = {"status": status, **({"observation": obs} if obs and status != "ok" else {})}
        return Trajectory(episode_id=f"e{i}", task_id=task, actor_id="a", policy_version=1,
                          tokens=np.zeros(n, np.int32), behaviour_logprobs=np.zeros(n, np.float32),
                          loss_mask=np.ones(n, np.uint8), turn_boundaries=np.zeros(1, np.int32), reward=reward,
                          reward_details=details)

    trajs = [traj(0, "a", -1.0, "incorrect"), traj(1, "a", -1.0, "compile_error"), traj(2, "a", -1.0, "incorrect"),
             traj(3, "a", 0.0, "ok"), traj(4, "a", 1.0, "ok"),
             traj(5, "b", -1.0, "incorrect"),                              # no correct sample of b
             traj(6, "c", 0.0, "ok"), traj(7, "c", -1.0, "forbidden"),     # forbidden: not repairable
             traj(8, "c", -1.0, "incorrect", obs="")]                      # no observation
    pairs = stages.repair_pairs(trajs, per_task=2, seed=0)
    assert len(pairs) == 2 and {b.task_id for b, _ in pairs} == {"a"} == {g.task_id for _, g in pairs}
    assert len({b.episode_id for b, _ in pairs}) == 2 and {g.episode_id for _, g in pairs} == {"e3", "e4"}
    assert all(b.reward < 0 <= g.reward for b, g in pairs)
    assert len(stages.repair_pairs(trajs, per_task=5)) == 3  # every failure of a, the correct ones in turn
    assert stages.repair_pairs(trajs, per_task=0) == []
    assert [(b.episode_id, g.episode_id) for b, g in stages.repair_pairs(trajs, 2, seed=3)] == \
        [(b.episode_id, g.episode_id) for b, g in stages.repair_pairs(trajs, 2, seed=3)]
    assert len(stages.repair_pairs(trajs, per_task=5, reward_threshold=1.0)) == 3  # only e4 counts as correct
    with pytest.raises(ValueError, match="per_task"):
        stages.repair_pairs(trajs, per_task=-1)
