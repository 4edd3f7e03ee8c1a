"""Where an actor's wall-clock time goes: seconds with the sampler busy, with at least one sandbox job in flight,
with both, and with neither (idle). Driven from the actor's event loop (`start` / `stop` around each call)."""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Callable, Iterator

ACTIVITIES = ("sampling", "sandbox")


class ActivityClock:
    """Busy time per activity (an activity is busy while at least one of its calls runs), and their overlap.

    `snapshot()` gives, in seconds: wall, sampling, sandbox, both, idle (= wall - time with either busy).
    Thread-safe. now: the clock (seconds; monotonic by default).
    """

    def __init__(self, now: Callable[[], float] = time.monotonic) -> None:
        self._now = now
        self._lock = threading.Lock()
        self._t0 = self._last = now()
        self._count = {a: 0 for a in ACTIVITIES}
        self._busy = {a: 0.0 for a in ACTIVITIES}
        self._both = 0.0
        self._any = 0.0

    def _advance(self, now: float) -> None:
        dt = now - self._last
        self._last = now
        on = [a for a in ACTIVITIES if self._count[a] > 0]
        for a in on:
            self._busy[a] += dt
        if on:
            self._any += dt
        if len(on) == len(ACTIVITIES):
            self._both += dt

    def start(self, activity: str) -> None:
        with self._lock:
            self._advance(self._now())
            self._count[activity] += 1

    def stop(self, activity: str) -> None:
        with self._lock:
            self._advance(self._now())
            self._count[activity] -= 1

    @contextlib.contextmanager
    def busy(self, activity: str) -> Iterator[None]:
        self.start(activity)
        try:
            yield
        finally:
            self.stop(activity)

    def snapshot(self) -> dict[str, float]:
        with self._lock:
            now = self._now()
            self._advance(now)
            wall = now - self._t0
            return {"wall_s": wall, "sampling_s": self._busy["sampling"], "sandbox_s": self._busy["sandbox"],
                    "both_s": self._both, "idle_s": wall - self._any}
