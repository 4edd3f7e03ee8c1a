"""Device-memory admission for several sandbox workers on one GPU (plain data: the node's lock guards it).

Why: one worker per GPU (the default) cannot run out of device memory for its neighbours' sake, but a node with
several workers per GPU (`ServiceConfig.workers` > GPUs, to overlap one evaluation's CPU work with another's
timing) can: three evaluations of a task with 2 GiB tensors ran an 80 GiB H100 out of memory (benchmarks/RESULTS.md,
session 22), and a candidate that fails that way would be answered `runtime_error`, reward -1, for its
neighbours' memory: a wrong reward.

Two parts:
- Reservation (`DeviceLedger`): a job reserves `job_memory_factor` x the trusted worker's measured device peak for
  its task (`EvalResult.device_peak_bytes`, learned per task by `TaskFootprints`; 0 while a task is unmeasured)
  and starts only when the reservations of the jobs running on its GPU leave room for it. A job that fits on no
  GPU with a free slot is held by the slot that took it; that GPU's other slots take no new job meanwhile (no
  starvation of large jobs), and the job is put back in the queue as soon as another GPU with a free slot has
  room, its deadline passes or the node drains.
- Safety net (`out_of_memory`): a job on a shared GPU whose result reports a device out-of-memory error before
  the profile, with trusted evidence that the GPU's memory was nearly exhausted by others
  (`EvalResult.device_free_fraction`, below `ServiceConfig.oom_free_fraction`: read by the trusted worker after the
  failed candidate's processes have exited, so their own memory is not in it), is evaluated again alone. The
  message text is the candidate's to write, so it alone decides nothing. The re-run shares one budget with
  internal_error retries: after a result, a job is evaluated again at most max(1, internal_error_retries) times
  (requeues after a lost worker are bounded apart), and its last answer is final. The profile is excluded so that a
  candidate cannot draw its timing twice.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
from typing import Any

from sandbox.result import OOM_PATTERN

_OOM_STATUSES = ("runtime_error", "internal_error", "timeout", "load_error")


def out_of_memory(result: dict[str, Any], free_fraction_max: float) -> bool:
    """Whether an evaluation result (EvalResult.to_dict()) failed for lack of device memory: a failing status
    (runtime_error, internal_error, timeout, load_error) whose message or log names a device out-of-memory error
    (torch's "CUDA out of memory", the driver's CUDA_ERROR_OUT_OF_MEMORY, the runtime's cudaErrorMemoryAllocation),
    and the trusted worker's reading of the device's free memory right after the failure (device_free_fraction,
    0..1; -1 = not read: the CPU backend, the profile) below `free_fraction_max`."""
    if result.get("status") not in _OOM_STATUSES:
        return False
    free = result.get("device_free_fraction", -1.0)
    if not isinstance(free, (int, float)) or not 0 <= free < free_fraction_max:
        return False
    texts = [str(result.get("message", ""))] + [str(x) for x in result.get("log", [])[-8:]]
    return any(OOM_PATTERN.search(t) for t in texts)


def task_footprint_key(task: dict[str, Any]) -> str:
    """Key under which a task's device footprint is learned: sha256 (16 hex) of its id, reference source, shape
    parameters and dtype (the things that decide its tensors' sizes)."""
    doc = {k: task.get(k) for k in ("id", "task_id", "reference", "shape_params", "dtype")}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()[:16]


class TaskFootprints:
    """Largest device peak (bytes) seen per task key, LRU-bounded to `max_tasks` entries."""

    def __init__(self, max_tasks: int = 10_000):
        if max_tasks < 1:
            raise ValueError(f"TaskFootprints: max_tasks must be >= 1, got {max_tasks}")
        self.max_tasks = max_tasks
        self._peak: "collections.OrderedDict[str, int]" = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._peak)

    def get(self, key: str) -> int:
        """Bytes, 0 for a task not measured yet."""
        v = self._peak.get(key, 0)
        if key in self._peak:
            self._peak.move_to_end(key)
        return v

    def record(self, key: str, peak_bytes: int) -> bool:
        """Keep the largest of the peaks seen for `key`; True when it grew (a peak of 0 or less, e.g. the CPU
        backend's, is ignored)."""
        if peak_bytes <= 0:
            return False
        old = self._peak.get(key, 0)
        self._peak[key] = max(old, int(peak_bytes))
        self._peak.move_to_end(key)
        while len(self._peak) > self.max_tasks:
            self._peak.popitem(last=False)
        return peak_bytes > old


@dataclasses.dataclass
class DeviceLedger:
    """The reservations of the jobs running on one device.

    capacity_bytes: what the jobs may reserve in all (0: unknown, reservations are not limited; exclusive jobs
      still run alone).
    reserved: slot index -> bytes reserved by the job that slot runs (0 for an unmeasured task).
    exclusive: slot indices whose job runs alone.
    holder: the slot holding a job that waits for room (the device's other slots take no new job meanwhile).
    shared: slot indices whose running job has had another job beside it on this device at some point.
    """

    capacity_bytes: int = 0
    reserved: dict[int, int] = dataclasses.field(default_factory=dict)
    exclusive: set[int] = dataclasses.field(default_factory=set)
    holder: int | None = None
    shared: set[int] = dataclasses.field(default_factory=set)

    def fits(self, need_bytes: int, exclusive: bool = False) -> bool:
        """Whether a job reserving `need_bytes` (alone when `exclusive`) may start now."""
        if not self.reserved:
            return True
        if exclusive or self.exclusive:
            return False
        return self.capacity_bytes <= 0 or sum(self.reserved.values()) + need_bytes <= self.capacity_bytes

    def blocked_for(self, slot: int) -> bool:
        """Whether `slot` must not take a new job because another slot holds one waiting for room."""
        return self.holder is not None and self.holder != slot

    def start(self, slot: int, need_bytes: int, exclusive: bool = False) -> None:
        """Record that `slot` starts a job (after `fits`)."""
        if self.reserved:
            self.shared.update(self.reserved)
            self.shared.add(slot)
        self.reserved[slot] = max(0, int(need_bytes))
        if exclusive:
            self.exclusive.add(slot)
        if self.holder == slot:
            self.holder = None

    def finish(self, slot: int) -> None:
        """Release `slot`'s reservation (and forget whether its job shared the device)."""
        self.reserved.pop(slot, None)
        self.exclusive.discard(slot)
        self.shared.discard(slot)


def gpu_memory_bytes(visible: str) -> int:
    """Total memory (bytes) of the GPU named by a `CUDA_VISIBLE_DEVICES` entry (an index or a GPU-/MIG- UUID),
    from NVML; 0 when NVML does not answer (torch is not imported: the node never makes a CUDA context)."""
    text = str(visible).strip()
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            if text.upper().startswith(("GPU-", "MIG-")):
                h = pynvml.nvmlDeviceGetHandleByUUID(text)
            else:
                h = pynvml.nvmlDeviceGetHandleByIndex(int(text))
            return int(pynvml.nvmlDeviceGetMemoryInfo(h).total)
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no NVML or no such GPU: capacity unknown
        return 0
