"""The learner service: acknowledged trajectories in, PPO updates, weights out, checkpoints.

    actors ──Trajectory──> TrajectoryReceiver (protocol: durable fsync'd spool, acks, seen-id set)
                                └─ spool.read ─> StageStore (this stage's trajectories kept on disk)
                                               └> TrajectoryBuffer (bounded, staleness bound)
                                                     └─ take ─> pack_trajectories ─> ppo_update
    AsyncWeightPublisher (pinned-host copy, background thread) ─> WeightsPublisher ─> actors, every K updates
    LearnerCheckpointer (Orbax, async) every M updates and on stop (SIGTERM)

Nothing acknowledged is lost across a restart: the checkpoint records the spool position of the oldest
trajectory still waiting in the buffer (`data_position`: segment, offset, and how many records of that read
were already consumed), and a restarted service reads the spool again from there. Spool segments are released
(deleted) only up to the position of a checkpoint that is committed. Trajectories that were dropped as stale
out of order may be read again after a restart; they are stale still and dropped again.

Runs in one process (any number of local devices on a mesh). A multi-host learner would need every process to
see the same trajectories (not built yet).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from pathlib import Path
from typing import Any, Callable

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from learner import sharding, stages
from learner.batch import check_trajectory, pack_trajectories, reward_stats
from learner.buffer import TrajectoryBuffer
from learner.checkpoint import LearnerCheckpointer, LearnerMeta
from learner.config import LearnerConfig, ServiceConfig
from learner.metrics import MetricsLogger
from learner.publish import AsyncWeightPublisher
from learner.train_step import NonFiniteRun, TrainState, create_train_state, ppo_update
from protocol.auth import server_curve
from protocol.spool import SpoolPosition
from protocol.trajectory import Trajectory
from protocol.trajectory_channel import TrajectoryReceiver
from protocol.weights_channel import WeightsPublisher

log = logging.getLogger(__name__)

STATUS_DONE, STATUS_STOPPED, STATUS_TIME_BUDGET = "done", "stopped", "time_budget"
MAX_NONFINITE_UPDATES = 3
"""Updates in a row whose every policy step was skipped for a non-finite gradient before `step` raises
FloatingPointError (the stage fails, and a restart resumes from the last checkpoint)."""
WAIT_LOG_EVERY_S = 30.0
"""While no batch is ready, `step` logs what is buffered, received and refused this often (seconds)."""


@dataclasses.dataclass
class _Origin:
    """Where a buffered trajectory came from in the spool: the read that returned it and its index in it."""

    read_from: SpoolPosition
    index: int


class LearnerService:
    """One learner process (module docstring).

    Args:
      cfg: learner settings (PPO, optimisers, checkpoints, buffer, stages, mesh).
      svc: endpoints, stage, budgets.
      run_dir: folder of this stage's state: spool/, stages/, checkpoints/, metrics/, ready.json.
      policy_model, critic_model: the initial networks (ignored parts are replaced when a checkpoint exists).
      mesh: device mesh for the states and batches (default: cfg.mesh over all local devices).
      on_update: called after each update with (service, trajectories, metrics); it may add metrics.
    """

    def __init__(
        self,
        cfg: LearnerConfig,
        svc: ServiceConfig,
        run_dir: str | Path,
        policy_model: nnx.Module,
        critic_model: nnx.Module,
        mesh: Mesh | None = None,
        on_update: Callable[["LearnerService", list, dict], None] | None = None,
    ):
        self.cfg, self.svc = cfg, svc
        # refuse an unauthenticated bind beyond loopback before anything is built (protocol.auth.server_curve)
        curves = [server_curve(ep, svc.curve, svc.curve_secret_key, svc.curve_authorized_keys, who="learner",
                               init_hint="`cuda-agent learner keys DIR`")
                  for ep in (svc.trajectories, svc.weights)]
        self.curve_on = any(c is not None for c in curves)
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.mesh = mesh if mesh is not None else sharding.make_mesh(cfg.mesh)
        self.on_update = on_update
        self.stage = svc.stage
        self.max_turns = (cfg.stages.single_turn_max_turns if svc.stage == "single_turn_ppo"
                          else cfg.stages.multi_turn_max_turns)
        self.policy: TrainState = create_train_state(policy_model, cfg.policy_optim, cfg.ppo, self.mesh)
        self.critic: TrainState = create_train_state(critic_model, cfg.critic_optim, cfg.ppo, self.mesh)
        self.reference = jax.tree.map(lambda x: x.copy(), self.policy.params) if cfg.ppo.kl_coef > 0 else None
        self.key = jax.random.key(cfg.seed)
        self.update = 0
        self.version = 0
        self._read_pos = SpoolPosition()
        self._skip = 0
        self._origins: dict[str, _Origin] = {}
        self.counters = {"refused": 0, "over_turn_limit": 0, "trajectories_trained": 0}
        self.refused_reasons: dict[str, int] = {}  # check_trajectory reason -> count (kept in checkpoints)
        self.nonfinite = NonFiniteRun("learner", "update", MAX_NONFINITE_UPDATES)  # updates with no step applied
        self.ckpt = LearnerCheckpointer(self.run_dir / "checkpoints", cfg.checkpoint.max_to_keep,
                                        cfg.checkpoint.async_save)
        self._committed_position: SpoolPosition | None = None
        self._restore()
        self.buffer = TrajectoryBuffer(cfg.buffer_capacity, cfg.ppo.max_policy_lag)
        self.store = stages.StageStore(self.run_dir / "stages")
        self.metrics = MetricsLogger(self.run_dir / "metrics", enabled=jax.process_index() == 0)
        self.receiver = TrajectoryReceiver(svc.trajectories, self.run_dir / "spool", learner_id=f"learner-{svc.stage}",
                                           curve=curves[0])
        self.weights = WeightsPublisher(svc.weights, publisher_id=f"learner-{svc.stage}", curve=curves[1])
        self.publisher = AsyncWeightPublisher(self.weights, svc.publish_dtype)
        self._started = False
        self._last_wait_log = time.monotonic()
        self._last_save = time.monotonic()

    # ------------------------------------------------------------------------------------------ state
    def _restore(self) -> None:
        if self.ckpt.latest_step() is None:
            return
        policy, critic, reference, meta = self.ckpt.restore(
            policy=self.policy, critic=self.critic, reference=self.reference)
        self.policy, self.critic = policy, critic
        if reference is not None:
            self.reference = reference
        self.update, self.version = meta.update, meta.policy_version
        pos = meta.data_position or {}
        self._read_pos = SpoolPosition(int(pos.get("segment", 0)), int(pos.get("offset", 0)))
        self._skip = int(pos.get("skip", 0))
        self._committed_position = self._read_pos
        if meta.key() is not None:
            self.key = meta.key()
        self.counters.update(meta.extra.get("counters", {}))
        self.refused_reasons.update(meta.extra.get("refused_reasons", {}))
        log.info("learner: resumed at update %d, weights version %d, spool %s (+%d)", self.update, self.version,
                 self._read_pos, self._skip)

    def data_position(self) -> dict:
        """Where a restart must read the spool from: the read that returned the oldest unconsumed trajectory,
        and how many records of that read come before it."""
        oldest = self.buffer.oldest()
        if oldest is None:
            return {"segment": self._read_pos.segment, "offset": self._read_pos.offset, "skip": self._skip}
        o = self._origins[oldest.episode_id]
        return {"segment": o.read_from.segment, "offset": o.read_from.offset, "skip": o.index}

    def checkpoint(self, wait: bool = False) -> None:
        """Save now (asynchronously unless `wait`); release spool segments a committed checkpoint no longer needs."""
        self._last_save = time.monotonic()
        self.ckpt.wait()  # the previous save is committed: its data position is safe to release up to
        if self._committed_position is not None:
            self.receiver.spool.release(self._committed_position)
        pos = self.data_position()
        meta = LearnerMeta(update=self.update, policy_version=self.version, stage=self.stage, data_position=pos,
                           rng_key=LearnerMeta.key_data(self.key), extra={"counters": dict(self.counters),
                                                             "refused_reasons": dict(self.refused_reasons)})
        self.ckpt.save(self.update, policy=self.policy, critic=self.critic, reference=self.reference, meta=meta,
                       force=True)
        self._committed_position = SpoolPosition(pos["segment"], pos["offset"])
        if wait:
            self.ckpt.wait()

    # ------------------------------------------------------------------------------------------ loop
    def start(self) -> "LearnerService":
        """Bind the endpoints and publish the current weights (actors can start sampling)."""
        self.receiver.start()
        self.weights.start()
        self.publisher.submit(self.version, self.policy.params)
        self.publisher.wait(timeout_s=600)
        self._started = True
        (self.run_dir / "ready.json").write_text(json.dumps({
            "trajectories": self.receiver.endpoint, "weights": self.weights.endpoint,
            "version": self.version, "update": self.update}))
        log.info("learner %s: trajectories on %s, weights v%d on %s", self.stage, self.receiver.endpoint,
                 self.version, self.weights.endpoint)
        return self

    def _fill(self, timeout_s: float) -> int:
        """Move trajectories from the spool into the buffer (as many as fit). Returns how many were read."""
        if self._skip:
            got, after = self.receiver.spool.read(self._read_pos, max_records=self._skip)
            if len(got) < self._skip:  # not durable yet?! keep waiting for them
                return 0
            self._read_pos, self._skip = after, 0
        free = self.buffer.free
        if free <= 0:
            return 0
        start = self._read_pos
        got, after = self.receiver.spool.read(start, max_records=free, timeout_s=timeout_s)
        if not got:
            return 0
        self.store.add(self.stage, got)
        for i, t in enumerate(got):
            if stages.turn_count(t) > self.max_turns:
                self.counters["over_turn_limit"] += 1
                continue
            reason = check_trajectory(t, self.cfg.max_seq_len)
            if reason is not None:  # kept in the spool and the stage store; never trained on
                self.counters["refused"] += 1
                self.refused_reasons[reason] = self.refused_reasons.get(reason, 0) + 1
                log.warning("learner: trajectory %s refused (%s); %d refused so far", t.episode_id, reason,
                            self.counters["refused"])
                continue
            self._origins[t.episode_id] = _Origin(start, i)
            if not self.buffer.add(t):
                self._origins.pop(t.episode_id, None)
        self._read_pos = after
        return len(got)

    def _forget(self, trajs: list[Trajectory]) -> None:
        for t in trajs:
            self._origins.pop(t.episode_id, None)

    def step(self) -> dict | None:
        """Read what arrived; run one PPO update when a batch is ready. Returns the update's metrics or None."""
        self._fill(self.svc.read_timeout_s)
        self._forget(self.buffer.drop_stale(self.version))
        n = self.cfg.batch_trajectories
        if len(self.buffer) < n:
            if time.monotonic() - self._last_wait_log > WAIT_LOG_EVERY_S:
                self._last_wait_log = time.monotonic()
                log.info("learner %s: waiting for a batch: %d/%d trajectories buffered, %d received, %d refused",
                         self.stage, len(self.buffer), n, self.receiver.stats["received"], self.counters["refused"])
            return None
        self._last_wait_log = time.monotonic()
        t0 = time.perf_counter()
        trajs = self.buffer.take(n, self.version)
        self._forget(trajs)
        packed, refused = pack_trajectories(trajs, self.cfg.max_seq_len, rows_multiple=self.cfg.ppo.minibatch_size,
                                            pack=self.cfg.pack_sequences, min_row_len=self.cfg.min_row_len,
                                            group_baselines=self.cfg.ppo.baseline == "group")
        self.counters["refused"] += len(refused)
        rollout = sharding.shard_batch(packed.to_rollout(), self.mesh)
        self.key, sub = jax.random.split(self.key)
        pack_s = time.perf_counter() - t0
        self.policy, self.critic, m = ppo_update(self.policy, self.critic, rollout, sub, self.reference, self.mesh)
        m["learner/pack_s"] = pack_s
        self.update += 1
        self.version += 1
        self.counters["trajectories_trained"] += len(packed.episode_ids)
        # the mean over the update's policy steps: 1 when none of them was applied (train_step._apply)
        self.nonfinite.observe(m.get("ppo/skipped_nonfinite", 0.0) >= 1.0, self.update)
        if self.update % self.cfg.publish_every_updates == 0:
            m["publish/blocked_s"] = self.publisher.submit(self.version, self.policy.params)
        lags = self.version - 1 - packed.policy_versions
        m.update(reward_stats(packed.final_rewards))
        m.update({
            "learner/update": self.update, "learner/policy_version": self.version,
            "learner/policy_lag_mean": float(np.mean(lags)), "learner/policy_lag_max": float(np.max(lags)),
            "learner/dropped_stale_total": self.buffer.stats["dropped_stale"],
            "learner/refused_total": self.counters["refused"],
            **{f"learner/refused_{k}_total": v for k, v in self.refused_reasons.items()},
            "learner/over_turn_limit_total": self.counters["over_turn_limit"],
            "learner/buffer_size": len(self.buffer), "learner/rows": packed.num_rows,
            "learner/group_singletons": packed.group_singletons,
            "learner/row_len": packed.tokens.shape[1],
            "learner/tokens": packed.num_tokens,
            "learner/tokens_per_s": packed.num_tokens / max(time.perf_counter() - t0, 1e-9),
            "learner/received_total": self.receiver.stats["received"],
            "learner/duplicates_total": self.receiver.stats["duplicates"],
            "publish/last_total_s": self.publisher.stats["total_s"],
            "publish/last_d2h_s": self.publisher.stats["d2h_s"],
            "publish/skipped_total": self.publisher.stats["skipped"],
        })
        if self.on_update is not None:
            self.on_update(self, trajs, m)
        self.metrics.log(self.update, m, histograms={"reward/final": packed.final_rewards, "learner/policy_lag": lags})
        if self.cfg.checkpoint.due(self.update, time.monotonic() - self._last_save):
            self.checkpoint()
        return m

    def run(self, stop: threading.Event | None = None) -> str:
        """Serve until `svc.max_updates` updates, the time budget, or `stop`; always ends with a checkpoint.
        Returns "done", "time_budget" or "stopped"."""
        if not self._started:
            self.start()
        stop = stop or threading.Event()
        t0 = time.monotonic()
        status = STATUS_DONE
        while True:
            if stop.is_set():
                status = STATUS_STOPPED
                break
            if self.svc.max_updates and self.update >= self.svc.max_updates:
                break
            if self.svc.time_budget_s and time.monotonic() - t0 > self.svc.time_budget_s:
                status = STATUS_TIME_BUDGET
                break
            self.step()
        self.checkpoint(wait=True)
        self.publisher.wait(timeout_s=600)
        return status

    def close(self) -> None:
        for part in (self.publisher, self.receiver, self.weights, self.store, self.metrics, self.ckpt):
            try:
                part.close()
            except Exception:  # closing must reach every part
                log.exception("learner: closing %s failed", type(part).__name__)
