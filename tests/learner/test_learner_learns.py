"""PPO learns: a tiny policy on the synthetic two-turn task (learner.synthetic) raises its mean reward from
its initial value to at least half-way to the maximum within a bounded number of updates (CPU, fixed seed;
3 seeds in benchmarks/learner_bench.py)."""

from __future__ import annotations

import os
import sys

import jax
import numpy as np
import pytest
from flax import nnx

sys.path.insert(0, os.path.dirname(__file__))
from _tiny_models import TINY  # noqa: E402

from learner import synthetic  # noqa: E402
from learner import train_step as ts  # noqa: E402
from learner.config import OptimizerConfig, PPOConfig  # noqa: E402
from learner.model import Critic, Transformer  # noqa: E402

MAX_UPDATES = 60
EPISODES_PER_UPDATE = 64


@pytest.mark.slow
def test_ppo_raises_reward_halfway_to_max_on_two_turn_task():
    seed = 0
    cfg = PPOConfig(minibatch_size=32, microbatch_size=32, epochs=2, gamma=1.0, lam=1.0, logits_chunk_size=0)
    opt = OptimizerConfig(lr=3e-3, warmup_steps=0)
    policy = ts.create_train_state(Transformer(TINY, nnx.Rngs(seed)), opt, cfg)
    critic = ts.create_train_state(Critic(TINY, nnx.Rngs(seed + 100)), opt, cfg)
    key = jax.random.key(seed)
    history = []
    for update in range(MAX_UPDATES):
        key, k_sample, k_update = jax.random.split(key, 3)
        rollout, reward = synthetic.sample_rollout(policy, k_sample, EPISODES_PER_UPDATE)
        history.append(float(np.mean(reward)))
        policy, critic, metrics = ts.ppo_update(policy, critic, rollout, k_update)
        assert np.isfinite(metrics["ppo/policy_loss"]) and np.isfinite(metrics["critic/value_loss"])
        initial = history[0]
        target = initial + 0.5 * (1.0 - initial)
        if len(history) >= 3 and np.mean(history[-3:]) >= target:
            break
    assert np.mean(history[-3:]) >= target, f"reward history {np.round(history, 3).tolist()}"
    assert initial < 0.15  # a near-uniform start: the gain is learnt, not given
