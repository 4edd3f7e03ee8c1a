"""Trajectory messages: `Trajectory` (actor -> learner) and `TrajectoryAck` (learner -> actor)."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import numpy as np

from protocol.errors import ProtocolError
from protocol.message import (Message, check_array, check_float, check_int, check_plain_map, check_text,
                              set_field)

ACK_STATUSES = ("stored", "duplicate")


@dataclasses.dataclass(frozen=True, eq=False)
class Trajectory(Message):
    """One finished episode, as the learner trains on it.

    Fields:
      episode_id: unique id of the episode (the learner drops duplicates by it).
      task_id: id of the task (`tasks.schema.Task.id`).
      actor_id: id of the actor process that sampled it.
      policy_version: weights version that sampled the tokens (for the staleness bound / decoupled PPO).
      tokens: [T] int32 token ids of the whole episode (prompt, model turns and tool feedback).
      behaviour_logprobs: [T] float32 log-probabilities of each token under the behaviour policy
        (0 where the policy did not sample the token).
      loss_mask: [T] uint8, 1 where the token was sampled by the policy (trained on), 0 elsewhere.
      turn_boundaries: [N] int32 token offsets where each turn starts, non-decreasing, within [0, T].
      reward: final (milestone) reward.
      reward_details: plain map explaining the reward (e.g. {"compiled": true, "speedup_vs_eager": 1.3}).
      episode_stats: plain map of statistics (turns, tool calls, wall time, ...).

    Raises:
      ProtocolError: a field of the wrong type, or the three [T] arrays of different lengths.
    """

    TYPE: ClassVar[str] = "Trajectory"
    ARRAYS: ClassVar[tuple[str, ...]] = ("tokens", "behaviour_logprobs", "loss_mask", "turn_boundaries")
    episode_id: str
    task_id: str
    actor_id: str
    policy_version: int
    tokens: np.ndarray
    behaviour_logprobs: np.ndarray
    loss_mask: np.ndarray
    turn_boundaries: np.ndarray
    reward: float
    reward_details: dict[str, Any] = dataclasses.field(default_factory=dict)
    episode_stats: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        t = self.TYPE
        check_text(t, "episode_id", self.episode_id)
        check_text(t, "task_id", self.task_id)
        check_text(t, "actor_id", self.actor_id)
        set_field(self, "policy_version", check_int(t, "policy_version", self.policy_version, lo=0))
        set_field(self, "tokens", check_array(t, "tokens", self.tokens, dtype=np.int32, ndim=1))
        set_field(self, "behaviour_logprobs",
                  check_array(t, "behaviour_logprobs", self.behaviour_logprobs, dtype=np.float32, ndim=1))
        set_field(self, "loss_mask", check_array(t, "loss_mask", self.loss_mask, dtype=np.uint8, ndim=1))
        set_field(self, "turn_boundaries",
                  check_array(t, "turn_boundaries", self.turn_boundaries, dtype=np.int32, ndim=1))
        n = len(self.tokens)
        for name in ("behaviour_logprobs", "loss_mask"):
            if len(getattr(self, name)) != n:
                raise ProtocolError(f"{t}.{name}", f"length {len(getattr(self, name))} != len(tokens) {n}")
        b = self.turn_boundaries
        if len(b) and (b.min() < 0 or b.max() > n or np.any(np.diff(b) < 0)):
            raise ProtocolError(f"{t}.turn_boundaries", f"must be non-decreasing offsets within [0, {n}]")
        set_field(self, "reward", check_float(t, "reward", self.reward))
        set_field(self, "reward_details", check_plain_map(t, "reward_details", self.reward_details))
        set_field(self, "episode_stats", check_plain_map(t, "episode_stats", self.episode_stats))

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)


@dataclasses.dataclass(frozen=True, eq=False)
class TrajectoryAck(Message):
    """The learner holds `episode_id` in its durable (fsync'd) spool. status: "stored" (first receipt) or
    "duplicate" (already held; the resend is dropped). The actor may forget the trajectory on either."""

    TYPE: ClassVar[str] = "TrajectoryAck"
    episode_id: str
    status: str = "stored"

    def __post_init__(self) -> None:
        check_text(self.TYPE, "episode_id", self.episode_id)
        check_text(self.TYPE, "status", self.status, choices=ACK_STATUSES)
