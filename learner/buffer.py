"""The learner's bounded trajectory buffer with the policy-lag staleness rule.

Trajectories wait here between the durable spool and a PPO update. The buffer holds at most `capacity`
trajectories (a full buffer refuses more; the service leaves them in the spool and reads them later), drops
repeated episode ids, and applies the staleness bound of asynchronous PPO: a trajectory sampled with policy
version v is used at learner version V only when V - v <= max_policy_lag; older ones are dropped and counted
(`stats["dropped_stale"]`). With decoupled PPO (learner.ppo) moderately stale data stays useful; the bound
caps how far the behaviour policy may drift from the proximal one.
"""

from __future__ import annotations

import collections
import threading
from typing import Any, Protocol


class TrajectoryLike(Protocol):
    """What the buffer needs of a trajectory (protocol.trajectory.Trajectory has it)."""

    episode_id: str
    policy_version: int


class TrajectoryBuffer:
    """Bounded FIFO of trajectories; thread-safe (a receiver thread adds, the training loop takes).

    Args:
      capacity: most trajectories held.
      max_policy_lag: the staleness bound (learner.config.PPOConfig.max_policy_lag).
    Counters in `stats`: added, taken, duplicates, refused_full, dropped_stale. `lags` counts taken
    trajectories by policy lag.
    """

    def __init__(self, capacity: int, max_policy_lag: int):
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        if max_policy_lag < 0:
            raise ValueError(f"max_policy_lag must be >= 0, got {max_policy_lag}")
        self.capacity = capacity
        self.max_policy_lag = max_policy_lag
        self._items: collections.deque[Any] = collections.deque()
        self._ids: set[str] = set()
        self._lock = threading.Lock()
        self.stats = collections.Counter({k: 0 for k in ("added", "taken", "duplicates", "refused_full", "dropped_stale")})
        self.lags: collections.Counter[int] = collections.Counter()

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    @property
    def free(self) -> int:
        with self._lock:
            return self.capacity - len(self._items)

    def add(self, traj: TrajectoryLike) -> bool:
        """Append one trajectory. Returns False (and counts it) when the buffer is full or already holds the
        episode id; the caller keeps the trajectory for later in the first case."""
        with self._lock:
            if traj.episode_id in self._ids:
                self.stats["duplicates"] += 1
                return False
            if len(self._items) >= self.capacity:
                self.stats["refused_full"] += 1
                return False
            self._items.append(traj)
            self._ids.add(traj.episode_id)
            self.stats["added"] += 1
            return True

    def oldest(self) -> TrajectoryLike | None:
        """The oldest trajectory still held (None when empty)."""
        with self._lock:
            return self._items[0] if self._items else None

    def is_stale(self, traj: TrajectoryLike, current_version: int) -> bool:
        return current_version - traj.policy_version > self.max_policy_lag

    def drop_stale(self, current_version: int) -> list[TrajectoryLike]:
        """Remove every trajectory past the lag bound at `current_version`; returns them (counted)."""
        with self._lock:
            keep, gone = collections.deque(), []
            for t in self._items:
                (gone if self.is_stale(t, current_version) else keep).append(t)
            self._items = keep
            for t in gone:
                self._ids.discard(t.episode_id)
            self.stats["dropped_stale"] += len(gone)
            return gone

    def take(self, n: int, current_version: int) -> list[TrajectoryLike]:
        """Drop stale trajectories, then remove and return up to `n` of the oldest ones."""
        self.drop_stale(current_version)
        with self._lock:
            out = [self._items.popleft() for _ in range(min(n, len(self._items)))]
            for t in out:
                self._ids.discard(t.episode_id)
                self.lags[max(0, current_version - t.policy_version)] += 1
            self.stats["taken"] += len(out)
            return out
