"""Synthetic multi-turn rollout batches for the learner's tests (random tokens, real structure)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from learner import train_step as ts


def multiturn_rollout(n_rows: int, T: int = 40, seed: int = 0, turns: int = 3, vocab: int = 32):
    """Rows of one trajectory each: a prompt, then up to `turns` assistant spans separated by observation
    spans, then padding; the final milestone reward (-1..3) on the last policy token.
    Returns (SequenceBatch `[n_rows, T]`, rewards `[n_rows, T]`)."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, vocab, (n_rows, T)).astype(np.int32)
    mask = np.zeros((n_rows, T), np.float32)
    seg = np.zeros((n_rows, T), np.int32)
    rewards = np.zeros((n_rows, T), np.float32)
    for b in range(n_rows):
        t = 3
        length = int(rng.integers(T // 2, T + 1))
        for _ in range(turns):
            n_act = int(rng.integers(2, 6))
            mask[b, t : min(t + n_act, length)] = 1
            t += n_act + int(rng.integers(2, 5))
            if t >= length:
                break
        seg[b, :length] = 1
        last = np.nonzero(mask[b])[0][-1]
        rewards[b, last] = rng.integers(-1, 4)
    pos = np.tile(np.arange(T, dtype=np.int32), (n_rows, 1)) * (seg > 0)
    seq = ts.SequenceBatch(*(jnp.asarray(x) for x in (tokens, pos, seg, mask)))
    return seq, jnp.asarray(rewards)


def micro(tree, m: int):
    """Split the leading row axis into `[m, rows / m, ...]`."""
    return jax.tree.map(lambda x: x.reshape((m, -1) + x.shape[1:]), tree)


def rollout_for(policy: ts.TrainState, n_rows: int, T: int = 40, seed: int = 0, noise: float = 0.1) -> ts.RolloutBatch:
    """A rollout whose behaviour logprobs are the policy's own plus Gaussian noise (a lagging actor)."""
    seq, rewards = multiturn_rollout(n_rows, T, seed)
    lp, _ = ts.policy_logprobs(policy, micro(seq, 1))
    rng = np.random.default_rng(seed + 1)
    behav = np.asarray(lp).reshape(n_rows, T) + noise * rng.normal(size=(n_rows, T)).astype(np.float32)
    return ts.RolloutBatch(seq, jnp.asarray(behav), rewards)
