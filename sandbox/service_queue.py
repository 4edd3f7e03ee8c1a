"""The sandbox node's bounded job queue and its result store (no sockets, no processes: plain data structures).

`JobQueue`: a heap ordered by (priority, deadline, arrival): evaluation jobs (priority 0) before training
rollouts (1 and up), earliest deadline first within a priority, then first come first served. It never holds
more than `max_jobs` entries: the node answers "busy" instead of queueing more (backpressure, not memory growth).

`ResultStore`: finished results by content key (LRU, bounded in bytes of their packed form) and by job id (LRU,
bounded in count and age), so the same solution is not evaluated twice and a resent job is answered from memory.
Results that must not be reused for another job (a `contended` timing, an `internal_error`) are kept under the
job id only.
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import itertools
import time
from typing import Any

import msgpack


@dataclasses.dataclass(eq=False)
class QueuedJob:
    """One admitted job. `payload` is whatever the node needs to run it; `waiters` are the (request, job id)
    pairs to answer when it finishes (several when resends or identical jobs were coalesced)."""

    key: str
    priority: int
    deadline: float            # time.monotonic() after which nobody waits for it
    payload: Any
    waiters: list[tuple[Any, str]] = dataclasses.field(default_factory=list)
    accepted: float = dataclasses.field(default_factory=time.monotonic)
    failures: int = 0          # workers lost while running it
    unreached: int = 0         # workers found dead when it arrived (not its doing; bounded separately)
    retries: int = 0           # internal_error results answered by running it again
    seq: int = 0


class JobQueue:
    """Bounded priority queue of QueuedJob (not thread-safe: the node holds its lock around every call)."""

    def __init__(self, max_jobs: int):
        if max_jobs < 1:
            raise ValueError(f"JobQueue: max_jobs must be >= 1, got {max_jobs}")
        self.max_jobs = max_jobs
        self._heap: list[tuple[int, float, int, QueuedJob]] = []
        self._seq = itertools.count()

    def __len__(self) -> int:
        return len(self._heap)

    def full(self) -> bool:
        return len(self._heap) >= self.max_jobs

    def push(self, job: QueuedJob, *, force: bool = False) -> bool:
        """Add `job`; False (not added) when full, unless `force` (a job handed back after its worker died keeps
        its place: it was admitted already)."""
        if self.full() and not force:
            return False
        if not job.seq:
            job.seq = next(self._seq) + 1
        heapq.heappush(self._heap, (job.priority, job.deadline, job.seq, job))
        return True

    def pop(self) -> QueuedJob | None:
        return heapq.heappop(self._heap)[3] if self._heap else None

    def peek(self) -> QueuedJob | None:
        """The job `pop` would return, left in the queue."""
        return self._heap[0][3] if self._heap else None

    def ahead_of(self, priority: int) -> int:
        """Jobs that would be served before a new job of `priority`."""
        return sum(1 for p, _, _, _ in self._heap if p <= priority)

    def drain(self) -> list[QueuedJob]:
        """Remove and return every queued job."""
        out = [e[3] for e in self._heap]
        self._heap.clear()
        return out

    def depth_by_priority(self) -> dict[int, int]:
        return dict(collections.Counter(p for p, _, _, _ in self._heap))


class ResultStore:
    """Finished results, by content key and by job id (not thread-safe: the node holds its lock).

    Args:
      max_bytes: bound on the packed size of all results kept (LRU); a result larger than this is not kept.
      max_job_ids: bound on the job ids remembered (LRU).
      job_id_ttl_s: how long a job id is remembered.
      reuse_by_content: answer a new job whose content key matches a finished one from the store (False: only
        resends of the same job id are answered from memory).
    """

    def __init__(self, max_bytes: int, max_job_ids: int, job_id_ttl_s: float, reuse_by_content: bool = True):
        self.max_bytes = max_bytes
        self.max_job_ids = max_job_ids
        self.job_id_ttl_s = job_id_ttl_s
        self.reuse_by_content = reuse_by_content
        self._packed: collections.OrderedDict[str, bytes] = collections.OrderedDict()  # store key -> result
        self._bytes = 0
        self._by_job: collections.OrderedDict[str, tuple[str, float]] = collections.OrderedDict()  # -> store key
        self.hits = collections.Counter({"job_id": 0, "content": 0})

    @property
    def size_bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._packed)

    def put(self, job_id: str, key: str, result: dict[str, Any], *, reusable: bool) -> None:
        """Remember `result` for `job_id`, and for content `key` when `reusable` (else under the job id only)."""
        packed = msgpack.packb(result, use_bin_type=True)
        if len(packed) > self.max_bytes:
            return
        store_key = ("content:" + key) if reusable else ("job:" + job_id)
        old = self._packed.pop(store_key, None)
        if old is not None:
            self._bytes -= len(old)
        self._packed[store_key] = packed
        self._bytes += len(packed)
        while self._bytes > self.max_bytes:
            _, dropped = self._packed.popitem(last=False)
            self._bytes -= len(dropped)
        self._by_job.pop(job_id, None)
        self._by_job[job_id] = (store_key, time.monotonic())
        while len(self._by_job) > self.max_job_ids:
            self._by_job.popitem(last=False)

    def by_job(self, job_id: str) -> dict[str, Any] | None:
        """The result of a job id seen before (None when unknown, expired or evicted)."""
        self._expire()
        item = self._by_job.get(job_id)
        if item is None:
            return None
        out = self._get(item[0])
        if out is not None:
            self.hits["job_id"] += 1
        return out

    def by_content(self, key: str) -> dict[str, Any] | None:
        """A finished result of the same content (None when unknown, evicted, or reuse is off)."""
        if not self.reuse_by_content:
            return None
        out = self._get("content:" + key)
        if out is not None:
            self.hits["content"] += 1
        return out

    def _get(self, store_key: str) -> dict[str, Any] | None:
        packed = self._packed.get(store_key)
        if packed is None:
            return None
        self._packed.move_to_end(store_key)
        return msgpack.unpackb(packed, raw=False, strict_map_key=False)

    def _expire(self) -> None:
        cutoff = time.monotonic() - self.job_id_ttl_s
        while self._by_job:
            first = next(iter(self._by_job.values()))
            if first[1] >= cutoff:
                break
            self._by_job.popitem(last=False)
