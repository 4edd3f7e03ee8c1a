"""A synthetic two-turn task with a programmatic reward, to check that the learner learns (tests, benchmarks).

Episode layout (8 tokens, one row each):

    position  0     1   2  3    4    5   6  7
    token     BOS   p   a1 a2   OBS  o   b1 b2
    mask      0     0   1  1    0    0   1  1

`p` (prompt) and `o` (the environment's observation, drawn after the first turn) are uniform in
[FIRST_SYMBOL, FIRST_SYMBOL + n_symbols). The policy writes a1, a2 (turn 1), then b1, b2 (turn 2). Reward, given
once at the end: the fraction of the four written tokens that are right, where turn 1 should answer
`p + ANSWER1` and turn 2 should answer `o + ANSWER2`. A uniform policy over V tokens scores about 1/V; the
maximum is 1. Turn 2 can only be solved by reading the observation, and turn 1's credit must flow back across
the observation span: a learner that leaks loss onto observation tokens, or cuts the GAE recursion there,
learns it slower or not at all.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from learner import ppo
from learner.train_step import RolloutBatch, SequenceBatch, TrainState
from protocol.trajectory import Trajectory

BOS, OBS, FIRST_SYMBOL = 1, 2, 3
ANSWER1, ANSWER2 = 8, 16
LENGTH = 8
POLICY_POSITIONS = (2, 3, 6, 7)


@dataclasses.dataclass(frozen=True)
class SyntheticTask:
    """n_symbols: how many prompt / observation values (vocabulary must hold FIRST_SYMBOL + n_symbols + ANSWER2)."""

    n_symbols: int = 4

    def min_vocab(self) -> int:
        return FIRST_SYMBOL + self.n_symbols + ANSWER2


@functools.partial(jax.jit, static_argnames=("batch", "n_symbols"))
def _sample_episodes(state: TrainState, key: jax.Array, batch: int, n_symbols: int):
    model = nnx.merge(state.graphdef, state.params, state.rest)
    k_p, k_o, k_s = jax.random.split(key, 3)
    p = jax.random.randint(k_p, (batch,), FIRST_SYMBOL, FIRST_SYMBOL + n_symbols)
    o = jax.random.randint(k_o, (batch,), FIRST_SYMBOL, FIRST_SYMBOL + n_symbols)
    tokens = jnp.zeros((batch, LENGTH), jnp.int32)
    tokens = tokens.at[:, 0].set(BOS).at[:, 1].set(p).at[:, 4].set(OBS).at[:, 5].set(o)
    positions = jnp.broadcast_to(jnp.arange(LENGTH, dtype=jnp.int32), (batch, LENGTH))
    segs = jnp.ones((batch, LENGTH), jnp.int32)
    logprobs = jnp.zeros((batch, LENGTH), jnp.float32)
    for t, k in zip(POLICY_POSITIONS, jax.random.split(k_s, len(POLICY_POSITIONS))):
        logits = model(tokens, positions, segs)[:, t - 1].astype(jnp.float32) / state.ppo.temperature
        tok = jax.random.categorical(k, logits).astype(jnp.int32)
        lp, _ = ppo.next_token_logprobs_and_entropy(logits, tok, 1.0)
        tokens = tokens.at[:, t].set(tok)
        logprobs = logprobs.at[:, t].set(lp)
    right = jnp.stack([tokens[:, 2] == p + ANSWER1, tokens[:, 3] == p + ANSWER1,
                       tokens[:, 6] == o + ANSWER2, tokens[:, 7] == o + ANSWER2], axis=1)
    reward = jnp.mean(right.astype(jnp.float32), axis=1)
    return tokens, logprobs, reward


def sample_rollout(state: TrainState, key: jax.Array, batch: int, task: SyntheticTask = SyntheticTask()):
    """Sample `batch` episodes with the policy in `state` (temperature `state.ppo.temperature`).

    Returns (RolloutBatch `[batch, 8]` with the reward on the last policy token, rewards `[batch]` f32).
    """
    tokens, logprobs, reward = _sample_episodes(state, key, batch, task.n_symbols)
    mask = np.zeros((batch, LENGTH), np.float32)
    mask[:, list(POLICY_POSITIONS)] = 1
    token_rewards = jnp.zeros((batch, LENGTH), jnp.float32).at[:, LENGTH - 1].set(reward)
    positions = jnp.broadcast_to(jnp.arange(LENGTH, dtype=jnp.int32), (batch, LENGTH))
    seq = SequenceBatch(tokens, positions, jnp.ones((batch, LENGTH), jnp.int32), jnp.asarray(mask))
    return RolloutBatch(seq, logprobs, token_rewards), reward


def to_trajectories(rollout: RolloutBatch, rewards, policy_version: int = 0, prefix: str = "syn") -> list[Trajectory]:
    """The episodes of a sampled rollout as protocol trajectories (what actors send)."""
    tokens = np.asarray(rollout.seq.tokens)
    logprobs = np.asarray(rollout.behaviour_logprobs)
    mask = np.asarray(rollout.seq.loss_mask).astype(np.uint8)
    rewards = np.asarray(rewards)
    return [
        Trajectory(episode_id=f"{prefix}-{policy_version}-{i}", task_id="synthetic", actor_id="synthetic",
                   policy_version=policy_version, tokens=tokens[i], behaviour_logprobs=logprobs[i],
                   loss_mask=mask[i], turn_boundaries=np.asarray([2, 6], np.int32), reward=float(rewards[i]),
                   episode_stats={"turns": 2})
        for i in range(tokens.shape[0])
    ]


def demonstrations(n: int, seed: int = 0, task: SyntheticTask = SyntheticTask(), prefix: str = "demo") -> list[Trajectory]:
    """`n` correct episodes (reward 1): the data of a supervised warm start (stage 0)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        p, o = (int(x) for x in rng.integers(FIRST_SYMBOL, FIRST_SYMBOL + task.n_symbols, 2))
        tokens = np.asarray([BOS, p, p + ANSWER1, p + ANSWER1, OBS, o, o + ANSWER2, o + ANSWER2], np.int32)
        mask = np.zeros(LENGTH, np.uint8)
        mask[list(POLICY_POSITIONS)] = 1
        out.append(Trajectory(episode_id=f"{prefix}-{i}", task_id="synthetic", actor_id="demo", policy_version=0,
                              tokens=tokens, behaviour_logprobs=np.zeros(LENGTH, np.float32), loss_mask=mask,
                              turn_boundaries=np.asarray([2, 6], np.int32), reward=1.0, episode_stats={"turns": 2}))
    return out


def with_group_baselines(rollout: RolloutBatch, reward) -> RolloutBatch:
    """The rollout with leave-one-out group baselines (`learner.batch.leave_one_out_baselines`), an episode's
    group being its prompt symbol `p` (position 1): the episodes of one "task"."""
    from learner.batch import leave_one_out_baselines

    prompts = np.asarray(rollout.seq.tokens[:, 1]).tolist()
    base, _ = leave_one_out_baselines(np.asarray(reward).tolist(), [str(p) for p in prompts])
    return rollout.replace(baselines=jnp.asarray(base)[:, None] * rollout.seq.loss_mask)


def run_ppo(seed: int, updates: int = 60, episodes: int = 64, stop_at_half: bool = True,
            baseline: str = "critic") -> dict:
    """PPO from scratch on this task with a tiny `learner.model` policy and critic (CPU is enough); `baseline`
    as `PPOConfig.baseline` (group: episodes grouped by their prompt symbol).

    Returns {"seed", "initial" (mean reward of the first batch), "final" (mean of the last 3 batches),
    "updates_to_half" (first update after which the last 3 batches average at least half-way from the initial
    reward to 1, or None), "history", "wall_s"}.
    """
    import time

    from learner import train_step as ts
    from learner.config import OptimizerConfig, PPOConfig
    from learner.model import Critic, ModelConfig, Transformer

    t0 = time.perf_counter()
    mc = ModelConfig.tiny(vocab_size=32, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16,
                          intermediate_size=64, max_position_embeddings=512)
    cfg = PPOConfig(minibatch_size=episodes // 2, microbatch_size=episodes // 2, epochs=2, gamma=1.0, lam=1.0,
                    logits_chunk_size=0, baseline=baseline)
    opt = OptimizerConfig(lr=3e-3, warmup_steps=0)
    policy = ts.create_train_state(Transformer(mc, nnx.Rngs(seed)), opt, cfg)
    critic = ts.create_train_state(Critic(mc, nnx.Rngs(seed + 100)), opt, cfg)
    key = jax.random.key(seed)
    history: list[float] = []
    reached = None
    for u in range(updates):
        key, k_sample, k_update = jax.random.split(key, 3)
        rollout, reward = sample_rollout(policy, k_sample, episodes)
        history.append(float(np.mean(reward)))
        if baseline == "group":
            rollout = with_group_baselines(rollout, reward)
        policy, critic, _ = ts.ppo_update(policy, critic, rollout, k_update)
        target = history[0] + 0.5 * (1.0 - history[0])
        if reached is None and len(history) >= 3 and np.mean(history[-3:]) >= target:
            reached = u + 1
            if stop_at_half:
                break
    return {"seed": seed, "initial": history[0], "final": float(np.mean(history[-3:])), "updates_to_half": reached,
            "history": history, "wall_s": time.perf_counter() - t0}
