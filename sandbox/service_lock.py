"""The per-device timing lock: rewards are timed with the device to themselves, or flagged `contended`.

A kernel's reward rests on a timing whose top margin (5%) is of the order of timing noise; a sampler or a
learner running on the same GPU during the profile stage would make it meaningless. Every user of a GPU on a
host therefore shares one lock per GPU, a pair of `flock(2)` files under `/dev/shm/cuda-agent-locks/`
(tmpfs: nothing survives a reboot, and a lock dies with the process that held it, even on SIGKILL; mode 0600,
so candidate code, which runs as another uid, cannot take it):

    <dir>/<device key>.intent   the timer holds it exclusively while it waits and while it times
    <dir>/<device key>.lock     the timer holds it exclusively while it times; other users hold it shared

- The **timer** (the sandbox node's verify/profile worker, `DeviceTimingLock.timing`) takes `.intent`
  exclusively, which stops new shared holders from coming in, then waits up to `timeout_s` for `.lock`
  exclusively, i.e. for the shared holders already inside to finish their step. If it cannot have the lock in
  time it times anyway and the result is flagged `contended`, so the reward can be re-measured.
- **Other GPU users** (the sampler, the learner, anything else on that GPU) wrap each unit of GPU work (a decode
  step, a train step) in `DeviceTimingLock.shared()`: it waits while a timer holds or waits for the lock (writer
  preference, so the timer is not starved), then lets any number of shared users run side by side. A long
  job can also call `timing_requested()` between steps and yield.

How a one-GPU host shares its GPU: the sampler / learner and the sandbox worker time-share it. The sampler
runs each step (a prefill, a decode chunk) under `shared()`; the sandbox's trusted worker holds `timing()` only
around an evaluation's timed sections (the calibration and the profile, well under a second each for the tasks
of the paper's window) and `shared()` around its untimed GPU work (reference stage, verification: `SharedUse`,
let go between two trials while a timer waits). While a timer holds the lock the sampler pauses at its next step
boundary, and rewards are timed alone. A process that ignores the lock cannot be stopped, but it makes
the timer wait past `timeout_s` only if it also holds the lock; otherwise it simply runs unnoticed - the
node therefore also counts timings taken without the lock (`contended`) and reports them.

The device key names the physical GPU, not the CUDA ordinal (which `CUDA_VISIBLE_DEVICES` renumbers): the
NVML UUID when NVML is there (`gpu-<uuid>`), else `gpu<index>`. The CPU backend uses no lock by default (its
N workers share the cores on purpose); `cpu` is its key when one is configured.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import os
import tempfile
import time
from pathlib import Path
from typing import Iterator

DEFAULT_LOCK_DIR = "/dev/shm/cuda-agent-locks" if os.path.isdir("/dev/shm") else \
    os.path.join(tempfile.gettempdir(), "cuda-agent-locks")


def gpu_device_key(visible: str | int) -> str:
    """Lock key for one GPU given its `CUDA_VISIBLE_DEVICES` entry (an index or a `GPU-...` UUID).

    An index is turned into the NVML UUID when NVML answers (so two processes that number GPUs differently agree),
    else stays `gpu<index>`.
    """
    text = str(visible).strip()
    if text.upper().startswith(("GPU-", "MIG-")):
        return text.lower()
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            uuid = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(int(text)))
        finally:
            pynvml.nvmlShutdown()
        return (uuid.decode() if isinstance(uuid, bytes) else str(uuid)).lower()
    except Exception:  # noqa: BLE001 - no NVML, no such GPU: fall back to the ordinal
        return f"gpu{text}"



def visible_gpu_key(ordinal: int = 0) -> str:
    """Lock key of the GPU this process sees as CUDA ordinal `ordinal` (torch's device index, JAX's GPU k):
    CUDA_VISIBLE_DEVICES renumbers GPUs, so its entry for that ordinal names the physical one (else the ordinal)."""
    visible = [x.strip() for x in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if x.strip()]
    return gpu_device_key(visible[ordinal] if ordinal < len(visible) else ordinal)

@dataclasses.dataclass
class LockState:
    """What a `timing()` section got. acquired: the lock was held for the whole section (False: `contended`);
    wait_ms: time spent waiting for it."""

    acquired: bool
    wait_ms: float


class DeviceTimingLock:
    """One device's timing lock (see the module doc). Cheap to create; open files only while held.

    Args:
      key: device key (`gpu_device_key(...)`, or "cpu"); letters, digits, "-", "_", "." only.
      lock_dir: folder of the lock files.
      poll_s: how often a waiter retries (flock has no timed wait).
      shared_group: let the owner's group use the lock too (folder 0770, files 0660); default owner only (0700 /
        0600). Candidate code runs as another uid (sandbox.jail) and so cannot even open the lock files, let alone
        hold them; every GPU user on the host must run as that owner (or in its group with shared_group).
    """

    def __init__(self, key: str, lock_dir: str | os.PathLike = DEFAULT_LOCK_DIR, poll_s: float = 0.002,
                 shared_group: bool = False):
        if not key or not all(c.isalnum() or c in "-_." for c in key):
            raise ValueError(f"DeviceTimingLock: key {key!r} may hold only letters, digits, '-', '_' and '.'")
        self.key = key
        self.dir = Path(lock_dir)
        self.poll_s = poll_s
        self.intent_path = self.dir / f"{key}.intent"
        self.lock_path = self.dir / f"{key}.lock"
        self.dir_mode, self.file_mode = (0o770, 0o660) if shared_group else (0o700, 0o600)

    def _open(self, path: Path) -> int:
        if not self.dir.is_dir():
            self.dir.mkdir(mode=self.dir_mode, parents=True, exist_ok=True)
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, self.file_mode)

    def _acquire(self, fd: int, kind: int, deadline: float | None) -> bool:
        """flock `fd` with `kind` (LOCK_SH / LOCK_EX), polling until `deadline` (None: wait forever)."""
        delay = self.poll_s
        while True:
            try:
                fcntl.flock(fd, kind | fcntl.LOCK_NB)
                return True
            except OSError as e:
                if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(delay if deadline is None else max(0.0, min(delay, deadline - time.monotonic())))
            delay = min(delay * 2, 0.05)

    @contextlib.contextmanager
    def timing(self, timeout_s: float) -> Iterator[LockState]:
        """Hold the device for a timing section. Yields a LockState; `acquired` is False when the lock could not
        be had within `timeout_s` (the section runs anyway: flag its result `contended`)."""
        t0 = time.monotonic()
        deadline = t0 + max(0.0, timeout_s)
        intent = self._open(self.intent_path)
        lock = -1
        try:
            got = self._acquire(intent, fcntl.LOCK_EX, deadline)
            if got:
                lock = self._open(self.lock_path)
                got = self._acquire(lock, fcntl.LOCK_EX, deadline)
            state = LockState(acquired=got, wait_ms=(time.monotonic() - t0) * 1e3)
            yield state
        finally:
            if lock >= 0:
                os.close(lock)  # closing the last descriptor releases the flock
            os.close(intent)

    @contextlib.contextmanager
    def shared(self, timeout_s: float | None = None) -> Iterator[bool]:
        """Wrap one unit of non-timing GPU work (a sampler or learner step). Waits while a timer holds or wants
        the lock; yields True when held, False when `timeout_s` passed first (the work should then run anyway
        or be skipped, as the caller decides)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        intent = self._open(self.intent_path)
        lock = -1
        try:
            got = self._acquire(intent, fcntl.LOCK_SH, deadline)
            if got:
                lock = self._open(self.lock_path)
                got = self._acquire(lock, fcntl.LOCK_SH, deadline)
            os.close(intent)  # let a timer queue up behind the work already inside
            intent = -1
            yield got
        finally:
            if lock >= 0:
                os.close(lock)
            if intent >= 0:
                os.close(intent)

    def timing_requested(self) -> bool:
        """True while a timer holds or waits for the lock (a cooperative user pauses at its next step)."""
        fd = self._open(self.intent_path)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return False
        except OSError:
            return True
        finally:
            os.close(fd)


class SharedUse:
    """The lock held shared over a span of untimed GPU work (a context manager), let go and taken again at each
    `pause()` while a timer waits, so that the timer waits for one step of the span (a verify trial, a decode
    chunk), not for all of it. With lock None it does nothing.

    wait_s: seconds spent waiting to take the lock (first take and every pause), for the caller's accounting.
    timeout_s: None (the default) waits as long as a timer holds the lock, so the work never runs without it; with a
    timeout the work goes on unlocked once it passes (`got` turns False), and a timer that takes the lock then times
    beside it unflagged: give one only to work that may disturb timings.
    Raises OSError from the lock files (e.g. a folder of another user) on entry, as `DeviceTimingLock.shared`.
    """

    def __init__(self, lock: "DeviceTimingLock | None", timeout_s: float | None = None):
        self.lock, self.timeout_s = lock, timeout_s
        self.wait_s = 0.0
        self.got = True  # False once a take ran out of timeout_s: the work then ran without the lock
        self._section: contextlib.ExitStack | None = None

    def _take(self) -> None:
        if self.lock is None:
            return
        section = contextlib.ExitStack()
        t0 = time.monotonic()
        self.got = section.enter_context(self.lock.shared(self.timeout_s)) and self.got
        self.wait_s += time.monotonic() - t0
        self._section = section

    def _release(self) -> None:
        section, self._section = self._section, None
        if section is not None:
            section.close()

    def __enter__(self) -> "SharedUse":
        self._take()
        return self

    def __exit__(self, *exc: object) -> None:
        self._release()

    @property
    def held(self) -> bool:
        """The lock is held shared now (inside the span, between pauses)."""
        return self._section is not None

    def pause(self) -> None:
        """Between two steps: when a timer holds or wants the lock, let it go and wait to take it again."""
        if self._section is not None and self.lock is not None and self.lock.timing_requested():
            self._release()
            self._take()
