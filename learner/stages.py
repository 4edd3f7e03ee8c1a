"""The paper's training stages, learner side (arXiv 2602.24286, Section 3; the main job runs them with actors).

  0 warm_start       supervised training of the actor on demonstrations (small models trained from scratch):
                     `sft_epochs` on the loss-mask (assistant) tokens.
  1 single_turn_ppo  PPO warm-up on one-turn episodes: `ppo_update` on trajectories within
                     `StageConfig.single_turn_max_turns` (`filter_turn_limit`).
  2 rft              rejection-sampling fine-tuning: the warm-up's trajectories with final reward >=
                     `StageConfig.rft_reward_threshold` (`rft_select`), then `sft_epochs` on them; optionally
                     with two-turn repair sequences from a failed and a correct sample of a task (`repair_pairs`).
  3 value_pretrain   the critic regresses the Monte-Carlo returns of those trajectories (`value_pretrain`),
                     so agentic PPO starts with a useful baseline.
  4 multi_turn_ppo   agentic PPO over episodes of up to `multi_turn_max_turns` turns and
                     `max_context_tokens` tokens.

Each stage's trajectories are kept on disk (`StageStore`, one durable protocol spool per stage), so RFT and
value pre-training read the warm-up's trajectories after a restart too.
"""

from __future__ import annotations

import collections
import dataclasses
from pathlib import Path
from typing import Iterator, Sequence

import jax
import numpy as np
from jax.sharding import Mesh

from learner import ppo, sharding
from learner.batch import PackedBatch
from learner.config import STAGES, PPOConfig
from learner.train_step import CriticBatch, SequenceBatch, TrainState, critic_train_step, critic_values, sft_train_step
from protocol.codec import encode
from protocol.spool import SpoolPosition, TrajectorySpool
from protocol.trajectory import Trajectory


def check_stage(stage: str) -> str:
    """Raises ValueError naming the allowed stages when `stage` is not one of them."""
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}; stages are {STAGES}")
    return stage


class StageStore:
    """Trajectories of each stage on disk: `<root>/<stage>/` is a `protocol.spool.TrajectorySpool`
    (fsync'd appends, duplicates by episode id refused)."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self._spools: dict[str, TrajectorySpool] = {}

    def spool(self, stage: str) -> TrajectorySpool:
        check_stage(stage)
        if stage not in self._spools:
            self._spools[stage] = TrajectorySpool(self.root / stage)
        return self._spools[stage]

    def add(self, stage: str, trajectories: Sequence[Trajectory]) -> int:
        """Append the trajectories not yet stored for `stage`; returns how many were new."""
        sp = self.spool(stage)
        fresh, seen = [], set()
        for t in trajectories:
            if t.episode_id in sp or t.episode_id in seen:
                continue
            seen.add(t.episode_id)
            fresh.append((t.episode_id, encode(t)))
        sp.append(fresh)
        return len(fresh)

    def read_all(self, stage: str) -> list[Trajectory]:
        sp = self.spool(stage)
        out: list[Trajectory] = []
        pos = SpoolPosition()
        while True:
            got, pos = sp.read(pos, max_records=1024)
            if not got:
                return out
            out.extend(got)

    def close(self) -> None:
        for sp in self._spools.values():
            sp.close()
        self._spools.clear()


def turn_count(t: Trajectory) -> int:
    """Assistant turns of a trajectory: `episode_stats["turns"]` when the actor reported it, else the number
    of contiguous policy-token spans."""
    turns = t.episode_stats.get("turns") if t.episode_stats else None
    if isinstance(turns, int):
        return turns
    m = np.asarray(t.loss_mask) > 0
    return int(np.count_nonzero(m[1:] & ~m[:-1]) + int(m[0]))


def filter_turn_limit(trajs: Sequence[Trajectory], max_turns: int) -> tuple[list[Trajectory], list[Trajectory]]:
    """(trajectories within the turn limit, those over it)."""
    ok = [t for t in trajs if turn_count(t) <= max_turns]
    over = [t for t in trajs if turn_count(t) > max_turns]
    return ok, over


def rft_select(trajs: Sequence[Trajectory], reward_threshold: float,
               max_task_pass_rate: float = 1.0) -> list[Trajectory]:
    """Rejection sampling: the trajectories whose final reward is at least `reward_threshold`, from tasks where at
    most `max_task_pass_rate` (0..1) of the task's trajectories in `trajs` reached it. Below 1, the tasks every
    sample already solves are left out: the policy has nothing left to learn there, and fine-tuning on them only
    sharpens it on those tasks (4 epochs on all of a PPO stage's correct episodes lowered every held-out figure:
    benchmarks/RESULTS.md, session 24). Raises ValueError for a rate outside [0, 1]."""
    if not 0.0 <= max_task_pass_rate <= 1.0:
        raise ValueError(f"max_task_pass_rate must be in [0, 1], got {max_task_pass_rate}")
    kept = [t for t in trajs if float(t.reward) >= reward_threshold]
    if max_task_pass_rate >= 1.0:
        return kept
    total = collections.Counter(t.task_id for t in trajs)
    passed = collections.Counter(t.task_id for t in kept)
    return [t for t in kept if passed[t.task_id] <= max_task_pass_rate * total[t.task_id]]


REPAIRABLE = ("compile_error", "load_error", "incorrect", "runtime_error")
"""Final statuses a repair sequence may start from: failures whose verify observation says what is wrong."""


def repair_pairs(trajs: Sequence[Trajectory], per_task: int, reward_threshold: float = 0.0,
                 seed: int = 0) -> list[tuple[Trajectory, Trajectory]]:
    """(failed, correct) trajectory pairs of the same task, for RFT's two-turn repair sequences (stages.rft.
    repair_per_task): a failed one has a final status in REPAIRABLE and its verify observation in
    reward_details["observation"] (actors.episode.Episode.reward_details); a correct one reached
    `reward_threshold`. Up to `per_task` pairs a task, each failure used once, the correct ones in turn; which
    ones is a seeded choice. Tasks without both kinds give none. Raises ValueError for a negative per_task."""
    if per_task < 0:
        raise ValueError(f"per_task must be >= 0, got {per_task}")
    failed: dict[str, list[Trajectory]] = collections.defaultdict(list)
    good: dict[str, list[Trajectory]] = collections.defaultdict(list)
    for t in trajs:
        d = t.reward_details or {}
        if float(t.reward) >= reward_threshold:
            good[t.task_id].append(t)
        elif d.get("status") in REPAIRABLE and isinstance(d.get("observation"), str) and d["observation"]:
            failed[t.task_id].append(t)
    rng = np.random.default_rng(seed)
    out = []
    for task in sorted(set(failed) & set(good)):
        bad = [failed[task][i] for i in rng.permutation(len(failed[task]))][:per_task]
        ok = [good[task][i] for i in rng.permutation(len(good[task]))]
        out += [(b, ok[i % len(ok)]) for i, b in enumerate(bad)]
    return out


def minibatch_indices(n_rows: int, minibatch: int, key: jax.Array, epochs: int = 1) -> Iterator[np.ndarray]:
    """Shuffled row indices, `minibatch` at a time, for `epochs` passes (n_rows a multiple of minibatch)."""
    if n_rows % minibatch:
        raise ValueError(f"{n_rows} rows is not a multiple of the minibatch size {minibatch}")
    for _ in range(epochs):
        key, sub = jax.random.split(key)
        perm = np.asarray(jax.random.permutation(sub, n_rows))
        for i in range(0, n_rows, minibatch):
            yield perm[i : i + minibatch]


def _micro_rows(tree, idx: np.ndarray, micro: int, mesh: Mesh | None):
    out = jax.tree.map(lambda x: np.asarray(x)[idx].reshape((len(idx) // micro, micro) + x.shape[1:]), tree)
    return sharding.shard_batch(out, mesh, row_axis=1) if mesh is not None else jax.tree.map(jax.numpy.asarray, out)


def _mean_metrics(rows: list[dict]) -> dict[str, float]:
    rows = jax.device_get(rows)
    return {k: float(np.mean([float(r[k]) for r in rows])) for k in rows[0]} if rows else {}


def sft_epochs(
    policy: TrainState, data: PackedBatch, key: jax.Array, epochs: int = 1, mesh: Mesh | None = None
) -> tuple[TrainState, dict[str, float]]:
    """Supervised fine-tuning (stages 0 and 2) on the loss-mask tokens of `data` for `epochs` passes of
    shuffled minibatches (`policy.ppo.minibatch_size` rows, `microbatch_size` per pass). Returns the new
    state and the metrics averaged over the steps (`sft/nll`, `sft/accuracy`, ...)."""
    cfg = policy.ppo
    seq = SequenceBatch(data.tokens, data.positions, data.segment_ids, data.loss_mask)
    rows = []
    for idx in minibatch_indices(data.num_rows, cfg.minibatch_size, key, epochs):
        policy, m = sft_train_step(policy, _micro_rows(seq, idx, cfg.microbatch_size, mesh))
        rows.append(m)
    return policy, _mean_metrics(rows)


def monte_carlo_returns(data: PackedBatch, gamma: float) -> np.ndarray:
    """Discounted returns `[N, L]` f32 of each policy token (sum of later rewards, gamma per policy token,
    observation tokens skipped): GAE with lambda = 1 and zero values."""
    _, ret = ppo.gae(data.rewards, np.zeros_like(data.rewards), data.loss_mask, gamma, 1.0, data.segment_ids)
    return np.asarray(ret)


def value_pretrain(
    critic: TrainState, data: PackedBatch, key: jax.Array, steps: int, mesh: Mesh | None = None
) -> tuple[TrainState, dict[str, float]]:
    """Stage 3: `steps` critic updates regressing the Monte-Carlo returns of `data` (unclipped value loss),
    cycling over shuffled minibatches. Returns the new state (with its original PPO config) and the
    metrics averaged over the last pass, plus `value_pretrain/explained_variance` after training."""
    cfg: PPOConfig = critic.ppo
    state = critic.replace(ppo=dataclasses.replace(cfg, value_clip_eps=None))
    returns = monte_carlo_returns(data, cfg.gamma)
    seq = SequenceBatch(data.tokens, data.positions, data.segment_ids, data.loss_mask)
    full = CriticBatch(seq, returns, np.zeros_like(returns))
    rows: list[dict] = []
    done = 0
    while done < steps:
        key, sub = jax.random.split(key)
        rows = []
        for idx in minibatch_indices(data.num_rows, cfg.minibatch_size, sub, 1):
            if done >= steps:
                break
            state, m = critic_train_step(state, _micro_rows(full, idx, cfg.microbatch_size, mesh))
            rows.append(m)
            done += 1
    metrics = _mean_metrics(rows)
    all_rows = np.arange(data.num_rows)
    values = critic_values(state, _micro_rows(seq, all_rows, cfg.microbatch_size, mesh)).reshape(returns.shape)
    metrics["value_pretrain/explained_variance"] = float(ppo.explained_variance(values, returns, data.loss_mask))
    return state.replace(ppo=cfg), metrics
