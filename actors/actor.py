"""The actor: many concurrent episodes on one event loop, their generations batched into one sampler call, their
sandbox calls overlapping sampling, weights refreshed between episodes, finished episodes handed to a sink.

    tasks ──> Actor.run: up to `concurrent_episodes` EpisodeRunner tasks
                 │ generate ──> GenerationBatcher ──(one thread)──> policy.generate   (activity "sampling")
                 │ tools    ──> SandboxStages ──> SandboxClient ──> nodes            (activity "sandbox")
                 └ episode ──> sink: TrajectorySink (learner, acked outbox) or ResultWriter (JSONL, evaluation)
    WeightsRefresher (thread) ──> PolicyVersions: new episodes start on the newest version

An episode that fails with a bug is logged and counted; the actor goes on. `stop` (a threading.Event, e.g.
set by SIGTERM) stops starting episodes; the running ones finish. `abort` (a second SIGTERM, a hard time budget)
ends the running episodes too, within about half a second: they are cancelled (counted as `episodes_aborted`,
not handed to the sink), a sandbox job they had in flight is left to its node, and `run` returns.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import json
import logging
import os
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from actors.activity import ActivityClock
from actors.batcher import GenerationBatcher
from actors.config import ActorConfig
from actors.episode import NOT_TRAINABLE, Episode, EpisodeContext, EpisodeRunner
from actors.sandbox_stages import SandboxStages
from actors.weights import PolicyVersions, WeightsRefresher
from learner.chat import ChatFormat
from tasks.schema import Task

log = logging.getLogger(__name__)
_END = object()


def default_actor_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


def cycle_tasks(tasks: list[Task], seed: int = 0, group_size: int = 1) -> Iterator[Task]:
    """Tasks forever, each pass in a new seeded random order, each task `group_size` times in a row (training;
    the group a group baseline compares). Raises ValueError for no tasks or group_size < 1."""
    import random

    if not tasks:
        raise ValueError("no tasks to run")
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    rng = random.Random(seed)
    while True:
        order = list(tasks)
        rng.shuffle(order)
        for task in order:
            for _ in range(group_size):
                yield task


def repeat_tasks(tasks: Iterable[Task], samples_per_task: int = 1) -> Iterator[Task]:
    """Each task `samples_per_task` times, then stop (evaluation)."""
    for task in tasks:
        for _ in range(samples_per_task):
            yield task


class TrajectorySink:
    """Finished episodes -> the learner through the acked outbox (protocol.trajectory_channel.TrajectoryOutbox).

    Episodes that must not be trained on (sandbox_error, policy_error) are counted, not sent. `put` blocks while
    the outbox holds `max_pending` unacked trajectories (the learner is away): the actor then stops starting
    episodes instead of growing memory.
    """

    def __init__(self, outbox: Any, actor_id: str):
        self.outbox = outbox
        self.actor_id = actor_id
        self.stats = collections.Counter({"sent": 0, "not_trainable": 0})

    def put(self, episode: Episode) -> None:
        if not episode.trainable:
            self.stats["not_trainable"] += 1
            return
        self.outbox.put(episode.trajectory(self.actor_id))
        self.stats["sent"] += 1


class ResultWriter:
    """Finished episodes -> one JSON line each (`Episode.result_row`) in `path` (evaluation mode)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self.rows = 0

    def put(self, episode: Episode) -> None:
        line = json.dumps(episode.result_row(), default=str)
        with self._lock, self.path.open("a") as f:
            f.write(line + "\n")
            self.rows += 1


class Actor:
    """Runs episodes (see the module doc).

    Args:
      config: ActorConfig (concurrency, batching, agent limits).
      chat: the chat format of the policy's tokenizer.
      stages: the sandbox stages (over a SandboxClient).
      versions: the policies held (one per weights version); `refresher` keeps it current when given.
      sink: where finished episodes go (`put(episode)`, may block; runs in a worker thread).
      fmt: solution format ("cubin" | "extension" | "cpu").
      refresher: a WeightsRefresher, or None for a fixed policy (evaluation).
      on_episode: optional callback per finished episode (in the event loop; e.g. a progress bar).
    """

    def __init__(self, config: ActorConfig, chat: ChatFormat, stages: SandboxStages, versions: PolicyVersions,
                 sink: Any, fmt: str, refresher: WeightsRefresher | None = None,
                 on_episode: Callable[[Episode], None] | None = None, clock: ActivityClock | None = None):
        self.cfg = config
        self.actor_id = config.actor_id or default_actor_id()
        self.clock = clock or stages.clock or ActivityClock()
        if stages.clock is None:
            stages.clock = self.clock
        self.batcher = GenerationBatcher(config.max_batch, config.gather_s, self.clock)
        self.ctx = EpisodeContext(chat=chat, config=config.agent, fmt=fmt, batcher=self.batcher, stages=stages)
        self.versions = versions
        self.sink = sink
        self.refresher = refresher
        self.on_episode = on_episode
        self.stats: collections.Counter = collections.Counter()
        self.by_status: collections.Counter = collections.Counter()
        self.by_version: collections.Counter = collections.Counter()
        self.rewards: list[float] = []
        self.failures_in_a_row = 0
        self._backoff_steps = 0  # backoffs in a row: the next wait is failure_backoff_s * 2 ** this
        self._hold_until = 0.0  # time.monotonic(): no new episode before it (failure backoff)
        self._sink_executor: concurrent.futures.ThreadPoolExecutor | None = None
        # staleness control (ActorConfig.episodes_per_version)
        self._first_version: int | None = None  # the first weights version held
        self._quota_used = 0  # episodes started, less those that ended without reaching the learner
        self._quota_extra = 0  # shares granted by the liveness valve
        self._quota_hold: tuple[int, float] | None = None  # (version, since) of the current hold

    async def run(self, tasks: Iterable[Task], max_episodes: int | None = None,
                  stop: threading.Event | None = None, abort: threading.Event | None = None) -> dict[str, Any]:
        """Run episodes until the tasks run out, `max_episodes` have started and finished, or `stop` is set (the
        running episodes finish first), or `abort` is set (they are cancelled); returns `summary()`. `tasks` may
        yield None for "nothing to run right now" (asked again shortly)."""
        loop = asyncio.get_running_loop()
        self._sink_executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="sink")
        self.batcher.reset()
        batcher_task = asyncio.create_task(self.batcher.run(), name="batcher")
        refresh_task = (asyncio.create_task(self.refresher.run(self.versions, self.cfg.weights_poll_s), name="weights")
                        if self.refresher is not None else None)
        task_iter = iter(tasks)
        running: set[asyncio.Task] = set()
        started = 0
        exhausted = False
        try:
            while True:
                if abort is not None and abort.is_set():
                    self.stats["episodes_aborted"] += len(running)
                    break
                while (len(running) < self.cfg.concurrent_episodes and not exhausted
                       and (max_episodes is None or started < max_episodes)
                       and not (stop is not None and stop.is_set())):
                    if self.versions.newest is None:
                        break  # no weights yet: wait below
                    if time.monotonic() < self._hold_until:
                        break  # backing off after failed episodes: wait below
                    if not self._within_quota(busy=bool(running)):
                        break  # as far ahead of the learner as allowed: wait below for newer weights
                    task = next(task_iter, _END)
                    if task is _END:
                        exhausted = True
                        break
                    if task is None:
                        break  # the source has nothing right now: ask again shortly
                    policy = self.versions.acquire()
                    episode_id = f"{self.actor_id}-{uuid.uuid4().hex[:16]}"
                    running.add(asyncio.create_task(self._episode(loop, task, policy, episode_id)))
                    started += 1
                    self._quota_used += 1
                    self.batcher.episodes = len(running)
                if not running:
                    if exhausted or (max_episodes is not None and started >= max_episodes) or \
                            (stop is not None and stop.is_set()):
                        break
                    await asyncio.sleep(0.05)  # waiting for weights, for a task, or for stop
                    continue
                # woken at least every 0.1 s: an abort lands while the running episodes' sandbox jobs are in flight
                done, running = await asyncio.wait(running, timeout=0.1, return_when=asyncio.FIRST_COMPLETED)
                self.batcher.episodes = len(running)
        finally:
            for t in running:
                t.cancel()
            for t in (batcher_task, refresh_task):
                if t is not None:
                    t.cancel()
            await asyncio.gather(*running, batcher_task, *([refresh_task] if refresh_task else []),
                                 return_exceptions=True)
            self.batcher.close()
            self._sink_executor.shutdown(wait=True)
        return self.summary()

    async def _episode(self, loop: asyncio.AbstractEventLoop, task: Task, policy: Any, episode_id: str) -> None:
        try:
            episode = await EpisodeRunner(self.ctx, task, policy, episode_id).run()
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - a bug in one episode must not stop the actor
            self.stats["episode_crashes"] += 1
            log.exception("actor %s: episode %s on task %s crashed", self.actor_id, episode_id, task.id)
            self._note_ending(failed=True, why="crashed")
            self._quota_used -= 1
            return
        finally:
            self.versions.release(policy)
        self._note_ending(failed=episode.status in NOT_TRAINABLE, why=f"{episode.status}: {episode.error}")
        if not episode.trainable:
            self._quota_used -= 1  # never reaches the learner: its place in the share goes to another episode
        self.stats["episodes"] += 1
        self.by_status[episode.status] += 1
        self.by_version[episode.policy_version] += 1
        if episode.trainable:
            self.rewards.append(episode.reward)
        try:
            await loop.run_in_executor(self._sink_executor, self.sink.put, episode)
        except Exception:  # noqa: BLE001 - e.g. a trajectory the protocol refuses: counted, the actor goes on
            self.stats["sink_errors"] += 1
            if episode.trainable:  # an untrainable one gave its place back above
                self._quota_used -= 1
            log.exception("actor %s: could not hand over episode %s", self.actor_id, episode_id)
        if self.on_episode is not None:
            self.on_episode(episode)

    def _within_quota(self, busy: bool = False) -> bool:
        """Staleness control (ActorConfig.episodes_per_version): may another episode start on the newest weights?
        Counts each version at which it says no once (`quota_holds`). `busy`: episodes of this actor are still
        running; their trajectories may yet complete the learner's batch, so the liveness valve's clock
        (`quota_max_wait_s`) starts only once none is left."""
        share = self.cfg.episodes_per_version
        if not share:  # None (nobody set it) or 0: no limit
            return True
        v = self.versions.newest_version
        if self._first_version is None:
            self._first_version = v
        allowed = (v - self._first_version + 1 + self.cfg.versions_ahead + self._quota_extra) * share
        if self._quota_used < allowed:
            self._quota_hold = None
            return True
        now = time.monotonic()
        if self._quota_hold is None or self._quota_hold[0] != v:
            self._quota_hold = (v, now)
            self.stats["quota_holds"] += 1
            log.info("actor %s: %d episodes on their way by weights version %d (%d a version, %d ahead): waiting "
                     "for newer weights", self.actor_id, self._quota_used, v, share, self.cfg.versions_ahead)
        elif busy:
            self._quota_hold = (v, now)  # the valve waits for a learner that has everything and still no update
        elif now - self._quota_hold[1] > self.cfg.quota_max_wait_s:
            self._quota_extra += 1
            self._quota_hold = None
            self.stats["quota_overrides"] += 1
            log.warning("actor %s: no weights newer than version %d for %.0f s: starting another %d episodes",
                        self.actor_id, v, self.cfg.quota_max_wait_s, share)
            return True
        return False

    def _note_ending(self, failed: bool, why: str) -> None:
        """Failure backoff (ActorConfig.failure_backoff_s): a failed episode delays the next start; the wait doubles
        with each further backoff in a row, up to failure_backoff_max_s. Failures that end while a wait is running
        (the other running episodes of the same outage) are counted but do not lengthen it. Any other ending clears
        it."""
        if not failed:
            self.failures_in_a_row, self._backoff_steps, self._hold_until = 0, 0, 0.0
            return
        self.failures_in_a_row += 1
        now = time.monotonic()
        if self.cfg.failure_backoff_s <= 0 or now < self._hold_until:
            return
        wait_s = min(self.cfg.failure_backoff_s * 2.0 ** min(self._backoff_steps, 62), self.cfg.failure_backoff_max_s)
        self._backoff_steps += 1
        self._hold_until = now + wait_s
        self.stats["backoffs"] += 1
        log.warning("actor %s: %d failed episodes in a row (last: %s); next episode in %.1f s", self.actor_id,
                    self.failures_in_a_row, why[:200], wait_s)

    def summary(self) -> dict[str, Any]:
        """Episodes by status and weights version, mean reward, batching and the time split (seconds)."""
        n = len(self.rewards)
        return {"actor_id": self.actor_id, "episodes": self.stats["episodes"],
                "episode_crashes": self.stats["episode_crashes"], "sink_errors": self.stats["sink_errors"],
                "episodes_aborted": self.stats["episodes_aborted"], "backoffs": self.stats["backoffs"],
                "quota_holds": self.stats["quota_holds"], "quota_overrides": self.stats["quota_overrides"],
                "by_status": dict(self.by_status), "by_version": {str(k): v for k, v in self.by_version.items()},
                "mean_reward": sum(self.rewards) / n if n else None, "batcher": dict(self.batcher.stats),
                "sandbox_calls": dict(self.ctx.stages.calls), "time": self.clock.snapshot(),
                "weights_swaps": self.versions.swaps}


def run_actor(actor: Actor, tasks: Iterable[Task], max_episodes: int | None = None,
              stop: threading.Event | None = None, abort: threading.Event | None = None) -> dict[str, Any]:
    """`Actor.run` on a fresh event loop (blocking)."""
    t0 = time.monotonic()
    out = asyncio.run(actor.run(tasks, max_episodes=max_episodes, stop=stop, abort=abort))
    out["elapsed_s"] = time.monotonic() - t0
    return out
