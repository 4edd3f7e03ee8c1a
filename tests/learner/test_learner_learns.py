"""PPO learns: a tiny policy on the synthetic two-turn task (learner.synthetic) raises its mean reward from
its initial value to at least half-way to the maximum within a bounded number of updates (CPU, fixed seed;
3 seeds in benchmarks/learner_bench.py)."""

from __future__ import annotations

import numpy as np
import pytest

from learner import synthetic

MAX_UPDATES = 60
EPISODES_PER_UPDATE = 64


@pytest.mark.slow
@pytest.mark.parametrize("baseline", ["critic", "group"])
def test_ppo_raises_reward_halfway_to_max_on_two_turn_task(baseline):
    # tiny learner.model policy + critic, PPO with GAE over the policy tokens of both turns (learner.synthetic);
    # group: the leave-one-out mean reward of the episodes with the same prompt instead of the critic
    r = synthetic.run_ppo(seed=0, updates=MAX_UPDATES, episodes=EPISODES_PER_UPDATE, stop_at_half=True,
                          baseline=baseline)
    assert r["initial"] < 0.15, r  # a near-uniform start: the gain is learnt, not given
    assert r["updates_to_half"] is not None, f"reward history {np.round(r['history'], 3).tolist()}"
    assert r["final"] >= r["initial"] + 0.5 * (1.0 - r["initial"])
