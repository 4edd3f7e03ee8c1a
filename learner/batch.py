"""Trajectories -> the row arrays of one PPO update (padding or sequence packing).

Input: trajectories as the protocol carries them (`protocol.trajectory.Trajectory`: tokens `[T]` int32,
behaviour_logprobs `[T]` f32, loss_mask `[T]` uint8, reward, policy_version, episode_id), all token-aligned
(see `learner.ppo`). Output: `[N, L]` rows (L = max_seq_len, or a power-of-two fraction of it that wastes
less padding: `pick_row_len`) where

  - with packing, trajectories are placed first-fit-decreasing into rows; each gets its own segment id
    (1, 2, ... within the row; attention never crosses ids), positions restart at 0, and GAE resets at
    segment boundaries; without packing, one trajectory per row;
  - the final reward sits on the trajectory's last policy token (token-level rewards elsewhere 0);
  - padding has segment id 0, loss mask 0, reward 0;
  - N is rounded up to a multiple of `rows_multiple` with empty rows (loss mask 0: they add nothing);
  - with `group_baselines`, each trajectory's leave-one-out group baseline (`leave_one_out_baselines`) sits on
    all its policy tokens of `baselines` (0 elsewhere; None without).

Refused (and reported with the reason): trajectories longer than L ("too_long"), without policy tokens
("no_policy_tokens"), with a policy token at position 0 that has no predecessor to predict it
("policy_token_at_start"), or with non-finite behaviour logprobs on policy tokens ("bad_logprobs").
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol, Sequence

import jax.numpy as jnp
import numpy as np

from learner.train_step import RolloutBatch, SequenceBatch


class TrajectoryLike(Protocol):
    episode_id: str
    policy_version: int
    tokens: np.ndarray
    behaviour_logprobs: np.ndarray
    loss_mask: np.ndarray
    reward: float


@dataclasses.dataclass
class PackedBatch:
    """Host (NumPy) arrays of one update, `[N, L]`, plus per-trajectory records.

    `placement[i] = (row, start)` of trajectory i (in `episode_ids` order); `final_rewards` and
    `policy_versions` are per trajectory.
    """

    tokens: np.ndarray
    positions: np.ndarray
    segment_ids: np.ndarray
    loss_mask: np.ndarray
    behaviour_logprobs: np.ndarray
    rewards: np.ndarray
    episode_ids: list[str]
    placement: list[tuple[int, int]]
    final_rewards: np.ndarray
    policy_versions: np.ndarray
    baselines: np.ndarray | None = None
    group_singletons: int = 0

    @property
    def num_rows(self) -> int:
        return self.tokens.shape[0]

    @property
    def num_tokens(self) -> int:
        """Tokens that belong to a trajectory (padding excluded)."""
        return int(np.count_nonzero(self.segment_ids))

    def to_rollout(self) -> RolloutBatch:
        """Device arrays for `learner.train_step.ppo_update` (place them with `sharding.shard_batch`)."""
        seq = SequenceBatch(jnp.asarray(self.tokens), jnp.asarray(self.positions), jnp.asarray(self.segment_ids),
                            jnp.asarray(self.loss_mask))
        return RolloutBatch(seq, jnp.asarray(self.behaviour_logprobs), jnp.asarray(self.rewards),
                            None if self.baselines is None else jnp.asarray(self.baselines))

    def to_sequences(self) -> SequenceBatch:
        """Device arrays for supervised steps (demonstrations, RFT)."""
        return self.to_rollout().seq


def leave_one_out_baselines(rewards: Sequence[float], groups: Sequence[str]) -> tuple[np.ndarray, int]:
    """Per trajectory, the mean reward of the other trajectories of its group (RLOO: Kool et al. 2019, "Buy 4
    REINFORCE samples, get a baseline for free!"; Ahmadian et al. 2024). A trajectory alone in its group gets the
    mean of all the other trajectories instead, and a batch of one trajectory gets 0 (plain REINFORCE).

    Args:
      rewards: `[B]` final rewards.
      groups: `[B]` group keys (the task id).
    Returns:
      baselines `[B]` f32 and the number of trajectories alone in their group.
    Raises ValueError when the lengths differ or there is no trajectory.
    """
    r = np.asarray(rewards, np.float64)
    if r.ndim != 1 or len(r) != len(groups):
        raise ValueError(f"rewards ({r.shape}) and groups ({len(groups)}) must be two sequences of one length")
    if len(r) == 0:
        raise ValueError("no trajectory to compute group baselines for")
    if len(r) == 1:
        return np.zeros(1, np.float32), 1
    keys = {g: i for i, g in enumerate(dict.fromkeys(groups))}
    gid = np.asarray([keys[g] for g in groups])
    g_sum = np.bincount(gid, weights=r)
    g_n = np.bincount(gid)
    n_in = g_n[gid]
    alone = n_in == 1
    within = (g_sum[gid] - r) / np.maximum(n_in - 1, 1)
    overall = (r.sum() - r) / (len(r) - 1)
    return np.where(alone, overall, within).astype(np.float32), int(alone.sum())


def check_trajectory(t: TrajectoryLike, max_seq_len: int) -> str | None:
    """The reason a trajectory is refused, or None when it is usable."""
    n = len(t.tokens)
    mask = np.asarray(t.loss_mask)
    if n > max_seq_len:
        return "too_long"
    if not mask.any():
        return "no_policy_tokens"
    if mask[0]:
        return "policy_token_at_start"
    if not np.all(np.isfinite(np.asarray(t.behaviour_logprobs)[mask > 0])):
        return "bad_logprobs"
    return None


def _first_fit(lengths: Sequence[int], row_len: int, pack: bool) -> tuple[list[int], list[tuple[int, int]]]:
    """Rows' used lengths and each sequence's (row, start): first-fit-decreasing when `pack`, else one a row."""
    placement: list[tuple[int, int]] = [(-1, -1)] * len(lengths)
    rows: list[int] = []
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i]) if pack else range(len(lengths))
    for i in order:
        n = lengths[i]
        row = -1
        if pack:
            for r, used in enumerate(rows):
                if used + n <= row_len:
                    row = r
                    break
        if row < 0:
            rows.append(0)
            row = len(rows) - 1
        placement[i] = (row, rows[row])
        rows[row] += n
    return rows, placement


def pick_row_len(lengths: Sequence[int], max_seq_len: int, min_row_len: int, rows_multiple: int = 1) -> int:
    """The row length L (max_seq_len / 2**k, at least `min_row_len` and the longest sequence) that packs
    `lengths` into the fewest padded positions, `ceil(rows / rows_multiple) * rows_multiple * L`; ties go to the
    longer row. Halving keeps the number of distinct shapes, so of compiled update steps, to log2 of the range.
    E.g. 32 sequences of about 2,000 tokens, 16-row minibatches, max_seq_len 16,384: 16 rows x 4,096 (65,536
    positions) instead of 16 rows x 16,384 (262,144) that rounding 4 full rows up to 16 would give."""
    longest = max(lengths, default=1)
    best_len, best_cost = max_seq_len, None
    L = max_seq_len
    while L >= max(min_row_len, longest, 1):
        rows, _ = _first_fit(lengths, L, pack=True)
        cost = -(-len(rows) // rows_multiple) * rows_multiple * L
        if best_cost is None or cost < best_cost:
            best_len, best_cost = L, cost
        if L % 2:
            break
        L //= 2
    return best_len


def pack_trajectories(
    trajectories: Sequence[TrajectoryLike],
    max_seq_len: int,
    rows_multiple: int = 1,
    pack: bool = True,
    min_row_len: int | None = None,
    group_baselines: bool = False,
) -> tuple[PackedBatch, list[tuple[str, str]]]:
    """Lay out trajectories in `[N, L]` rows (module docstring). L = max_seq_len, or with packing and
    `min_row_len` given, the shorter power-of-two fraction of it that `pick_row_len` finds. With
    `group_baselines`, the usable trajectories (they need a `task_id`) get leave-one-out baselines by task.
    Returns the batch and the refused trajectories as (episode_id, reason). Raises ValueError when nothing is
    usable."""
    refused: list[tuple[str, str]] = []
    ok: list[TrajectoryLike] = []
    for t in trajectories:
        reason = check_trajectory(t, max_seq_len)
        if reason is None:
            ok.append(t)
        else:
            refused.append((t.episode_id, reason))
    if not ok:
        raise ValueError(f"no usable trajectory among {len(trajectories)} (refused: {refused[:5]})")

    base, singletons = None, 0
    if group_baselines:
        base, singletons = leave_one_out_baselines([float(t.reward) for t in ok], [str(t.task_id) for t in ok])
    lengths = [len(t.tokens) for t in ok]
    row_len = max_seq_len
    if pack and min_row_len is not None:
        row_len = pick_row_len(lengths, max_seq_len, min_row_len, rows_multiple)
    rows, placement = _first_fit(lengths, row_len, pack)  # placement per trajectory (in input order)
    n_rows = -(-len(rows) // rows_multiple) * rows_multiple
    shape = (n_rows, row_len)
    tokens = np.zeros(shape, np.int32)
    positions = np.zeros(shape, np.int32)
    segs = np.zeros(shape, np.int32)
    mask = np.zeros(shape, np.float32)
    behav = np.zeros(shape, np.float32)
    rewards = np.zeros(shape, np.float32)
    baselines = None if base is None else np.zeros(shape, np.float32)
    next_seg = [1] * n_rows
    # fill in row order so that segment ids increase left to right
    for i in sorted(range(len(ok)), key=lambda i: placement[i]):
        t = ok[i]
        row, start = placement[i]
        n = len(t.tokens)
        sl = slice(start, start + n)
        m = np.asarray(t.loss_mask) > 0
        tokens[row, sl] = t.tokens
        positions[row, sl] = np.arange(n, dtype=np.int32)
        segs[row, sl] = next_seg[row]
        next_seg[row] += 1
        mask[row, sl] = m
        behav[row, sl] = np.where(m, t.behaviour_logprobs, 0.0)
        last = start + int(np.nonzero(m)[0][-1])
        rewards[row, last] = float(t.reward)
        if baselines is not None:
            baselines[row, sl] = np.where(m, base[i], 0.0)
    batch = PackedBatch(
        tokens, positions, segs, mask, behav, rewards,
        episode_ids=[t.episode_id for t in ok],
        placement=placement,
        final_rewards=np.asarray([float(t.reward) for t in ok], np.float32),
        policy_versions=np.asarray([int(t.policy_version) for t in ok], np.int64),
        baselines=baselines,
        group_singletons=singletons,
    )
    return batch, refused


def reward_stats(rewards: np.ndarray, prefix: str = "reward") -> dict[str, Any]:
    """Mean / std / min / max of final rewards and the count of each milestone value (-1, 0, 1, 2, 3)."""
    r = np.asarray(rewards, np.float64)
    out: dict[str, Any] = {
        f"{prefix}/mean": float(r.mean()),
        f"{prefix}/std": float(r.std()),
        f"{prefix}/min": float(r.min()),
        f"{prefix}/max": float(r.max()),
        f"{prefix}/count": int(r.size),
    }
    for v in (-1, 0, 1, 2, 3):
        out[f"{prefix}/frac_{v}".replace("-", "neg")] = float(np.mean(r == v))
    return out
