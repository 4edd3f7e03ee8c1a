"""Shared builders and comparisons for the protocol tests (imported by the tests and by spawned workers)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from protocol.trajectory import Trajectory


def make_trajectory(i: int, num_tokens: int = 64, actor_id: str = "actor-0", seed: int | None = None) -> Trajectory:
    rng = np.random.default_rng(i if seed is None else seed)
    return Trajectory(
        episode_id=f"ep-{i:06d}", task_id=f"task-{i % 7}", actor_id=actor_id, policy_version=i % 5,
        tokens=rng.integers(0, 150_000, num_tokens, dtype=np.int32),
        behaviour_logprobs=-rng.random(num_tokens, dtype=np.float32),
        loss_mask=(rng.random(num_tokens) < 0.7).astype(np.uint8),
        turn_boundaries=np.array([0, num_tokens // 2], dtype=np.int32) if num_tokens else np.zeros(0, np.int32),
        reward=float(i % 4 - 1), reward_details={"compiled": True, "speedup": 1.25, "i": i},
        episode_stats={"turns": 3, "tool_calls": [1, 2]},
    )


def assert_same_message(a, b) -> None:
    """Field-by-field equality; arrays compared by dtype, shape and bytes (NaN-safe)."""
    assert type(a) is type(b)
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray):
            assert isinstance(y, np.ndarray), f.name
            assert x.dtype == y.dtype and x.shape == y.shape, f.name
            assert x.tobytes() == y.tobytes(), f.name
        elif isinstance(x, float) and math.isnan(x):
            assert math.isnan(y), f.name
        else:
            assert x == y, f.name


def all_message_types() -> tuple:
    """Every typed message class of the protocol."""
    from protocol.handshake import Error, Heartbeat, Hello
    from protocol.sandbox_jobs import SandboxJob, SandboxResult
    from protocol.trajectory import TrajectoryAck
    from protocol.weights import WeightsChunk, WeightsChunkRequest, WeightsManifest, WeightsRequest

    return (Hello, Heartbeat, Error, Trajectory, TrajectoryAck, WeightsRequest, WeightsManifest,
            WeightsChunkRequest, WeightsChunk, SandboxJob, SandboxResult)
