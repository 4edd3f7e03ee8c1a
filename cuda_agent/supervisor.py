"""Process supervision for `cuda-agent train`: start the learner, actors and sandbox node as real OS processes,
restart the ones that die, and stop them all in order.

    sup = Supervisor(log_dir)
    sup.start(ProcessSpec("sandbox", argv=[...], ready_file=run/"sandbox.ready"))
    sup.wait_ready("sandbox", timeout_s=300)
    sup.start(ProcessSpec("actor-0", argv=[...], restart=True))
    ...
    sup.stop("actor-0")          # SIGTERM to its process group, SIGKILL after stop_timeout_s
    sup.close()                  # stops whatever still runs, in reverse start order

Each child runs in its own session (process group): Ctrl-C in the terminal reaches only `cuda-agent train`, which
then stops the children in an order that lets the learner write its checkpoint, and a child's own workers (the
sandbox node's worker processes) are stopped with it. On Linux each child also gets PR_SET_PDEATHSIG(SIGTERM), so
a supervisor killed with SIGKILL does not leave orphans behind.

A monitor thread polls the children every `poll_s`. A child that exits while nobody asked it to stop is
*crashed* when its exit code is not 0 or another of its `ok_exit_codes` (or it was killed by a signal), *finished*
otherwise. A crashed child with
`restart=True` is started again after `backoff_s * 2**k` seconds (k = restarts so far, capped at `max_backoff_s`)
until it has been restarted `max_restarts` times; then it is *failed* and stays down. Every transition is an
`Event`, kept in `events` and passed to `on_event` (the train driver logs them to the metrics JSONL).
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Sequence

log = logging.getLogger(__name__)

STATES = ("starting", "running", "finished", "crashed", "restarting", "failed", "stopped")


@dataclasses.dataclass
class ProcessSpec:
    """How to run one child.

    Fields:
      name: unique name ("learner", "actor-0", "sandbox").
      argv: the command line.
      env: extra environment variables (added to the supervisor's environment).
      cwd: working directory (default: the supervisor's).
      restart: start it again when it crashes.
      restart_on_exit_0: also start it again when it exits with status 0 (a service that should run until stopped).
      max_restarts: most restarts; past it the child is "failed".
      backoff_s: wait before the first restart; doubled per further restart.
      max_backoff_s: cap on that wait.
      stop_timeout_s: grace after SIGTERM before SIGKILL.
      ready_file: a file the child writes once it serves (removed before each start); `wait_ready` watches it.
      ok_exit_codes: exit statuses that mean *finished*, not *crashed* (e.g. a stage worker's 4, "nothing to train
        on"); the default is 0 alone.
    """

    name: str
    argv: Sequence[str]
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    cwd: str | None = None
    restart: bool = False
    restart_on_exit_0: bool = False
    max_restarts: int = 5
    backoff_s: float = 1.0
    max_backoff_s: float = 30.0
    stop_timeout_s: float = 60.0
    ready_file: str | None = None
    ok_exit_codes: tuple[int, ...] = (0,)

    def __post_init__(self) -> None:
        if not self.name or "/" in self.name:
            raise ValueError(f"ProcessSpec.name must be a non-empty name without '/', got {self.name!r}")
        if not self.argv:
            raise ValueError(f"ProcessSpec {self.name}: argv is empty")
        if self.max_restarts < 0 or self.backoff_s < 0 or self.stop_timeout_s <= 0:
            raise ValueError(f"ProcessSpec {self.name}: need max_restarts >= 0, backoff_s >= 0, stop_timeout_s > 0")


@dataclasses.dataclass
class Event:
    """A change of a child's state. `time` is time.time(); `returncode` is set for exits (negative: signal)."""

    time: float
    name: str
    state: str
    pid: int | None = None
    returncode: int | None = None
    restarts: int = 0
    message: str = ""

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


class ManagedProcess:
    """A child and its bookkeeping (read-only for callers; the Supervisor changes it)."""

    def __init__(self, spec: ProcessSpec, log_path: Path):
        self.spec = spec
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None
        self.state = "starting"
        self.restarts = 0
        self.stop_requested = False
        self.restart_at: float | None = None
        self.started_at = 0.0
        self.returncode: int | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


try:  # loaded once here: the child (between fork and exec) only calls it
    _PRCTL = ctypes.CDLL("libc.so.6", use_errno=True).prctl if sys.platform.startswith("linux") else None
except OSError:  # pragma: no cover - a libc without that name
    _PRCTL = None


def _pdeathsig() -> None:  # runs in the child between fork and exec
    if _PRCTL is not None:
        _PRCTL(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG


class Supervisor:
    """Starts, watches, restarts and stops child processes (see the module doc).

    Args:
      log_dir: each child's stdout and stderr go to `<log_dir>/<name>.log` (appended across restarts).
      on_event: called with each Event (from the monitor thread or the caller's thread); must not block.
      poll_s: monitor period in seconds.
    """

    def __init__(self, log_dir: str | Path, on_event: Callable[[Event], None] | None = None, poll_s: float = 0.25):
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.on_event = on_event
        self.poll_s = poll_s
        self.children: dict[str, ManagedProcess] = {}
        self.events: list[Event] = []
        self._lock = threading.RLock()
        self._closed = threading.Event()
        self._monitor = threading.Thread(target=self._watch, name="supervisor", daemon=True)
        self._monitor.start()

    # ------------------------------------------------------------------------------------------------ starting
    def start(self, spec: ProcessSpec) -> ManagedProcess:
        """Start a child. Raises ValueError if a child of that name is alive, OSError if it cannot be executed."""
        with self._lock:
            old = self.children.get(spec.name)
            if old is not None and old.alive:
                raise ValueError(f"process {spec.name!r} is already running (pid {old.pid})")
            mp = ManagedProcess(spec, self.log_dir / f"{spec.name}.log")
            self.children[spec.name] = mp
            self._spawn(mp)
            return mp

    def _spawn(self, mp: ManagedProcess) -> None:
        spec = mp.spec
        if spec.ready_file:
            Path(spec.ready_file).unlink(missing_ok=True)
        env = dict(os.environ)
        env.update({k: str(v) for k, v in spec.env.items()})
        with open(mp.log_path, "ab") as logf:
            logf.write(f"\n===== {time.strftime('%Y-%m-%d %H:%M:%S')} start {spec.name} (restart {mp.restarts}): "
                       f"{' '.join(map(str, spec.argv))}\n".encode())
            logf.flush()
            mp.proc = subprocess.Popen(list(map(str, spec.argv)), cwd=spec.cwd, env=env, stdin=subprocess.DEVNULL,
                                       stdout=logf, stderr=subprocess.STDOUT, start_new_session=True,
                                       preexec_fn=_pdeathsig if _PRCTL is not None else None)
        mp.state, mp.started_at, mp.returncode, mp.restart_at = "running", time.time(), None, None
        mp.stop_requested = False
        self._emit(Event(time.time(), spec.name, "running", mp.pid, restarts=mp.restarts))

    def wait_ready(self, name: str, timeout_s: float) -> None:
        """Block until the child's ready_file exists. Raises RuntimeError if the child failed or finished first
        (naming its log), TimeoutError after timeout_s."""
        mp = self.children[name]
        if not mp.spec.ready_file:
            raise ValueError(f"process {name!r} has no ready_file")
        deadline = time.monotonic() + timeout_s
        while not Path(mp.spec.ready_file).exists():
            if mp.state in ("failed", "finished", "stopped", "crashed"):
                raise RuntimeError(f"{name} {mp.state} before it was ready (exit {mp.returncode}); see {mp.log_path}:\n"
                                   + tail(mp.log_path))
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name} not ready after {timeout_s:.0f} s; see {mp.log_path}:\n"
                                   + tail(mp.log_path))
            time.sleep(0.1)

    def ready_info(self, name: str) -> dict:
        """The JSON content of a child's ready file ({} when it is empty or not JSON)."""
        try:
            return json.loads(Path(self.children[name].spec.ready_file).read_text() or "{}")
        except (OSError, ValueError, TypeError):
            return {}

    # ------------------------------------------------------------------------------------------------ watching
    def _emit(self, ev: Event) -> None:
        self.events.append(ev)
        log.info("process %s: %s%s", ev.name, ev.state, f" ({ev.message})" if ev.message else "")
        if self.on_event is not None:
            try:
                self.on_event(ev)
            except Exception:  # noqa: BLE001 - a reporting bug must not stop supervision
                log.exception("on_event failed")

    def _watch(self) -> None:
        while not self._closed.wait(self.poll_s):
            try:
                self.poll()
            except Exception:  # noqa: BLE001
                log.exception("supervisor poll failed")

    def poll(self) -> None:
        """Check every child once: record exits, restart crashed ones whose backoff has passed."""
        now = time.time()
        with self._lock:
            for mp in list(self.children.values()):
                if mp.state == "restarting" and mp.restart_at is not None and now >= mp.restart_at:
                    if self._closed.is_set():
                        continue
                    mp.restarts += 1
                    try:
                        self._spawn(mp)
                    except OSError as e:
                        mp.state = "failed"
                        self._emit(Event(now, mp.spec.name, "failed", message=f"cannot start: {e}"))
                    continue
                if mp.state != "running" or mp.proc is None:
                    continue
                rc = mp.proc.poll()
                if rc is None:
                    continue
                mp.returncode = rc
                if mp.stop_requested:
                    mp.state = "stopped"
                    self._emit(Event(now, mp.spec.name, "stopped", mp.pid, rc, mp.restarts))
                    continue
                spec = mp.spec
                crashed = rc not in spec.ok_exit_codes
                if crashed or spec.restart_on_exit_0:
                    state = "crashed" if crashed else "finished"
                    self._emit(Event(now, spec.name, state, mp.pid, rc, mp.restarts, _describe(rc)))
                    if spec.restart and mp.restarts < spec.max_restarts:
                        mp.state = "restarting"
                        delay = min(spec.backoff_s * (2 ** mp.restarts), spec.max_backoff_s)
                        mp.restart_at = now + delay
                        self._emit(Event(now, spec.name, "restarting", mp.pid, rc, mp.restarts,
                                         f"restart {mp.restarts + 1} of {spec.max_restarts} in {delay:.1f} s"))
                    elif spec.restart:
                        mp.state = "failed"
                        self._emit(Event(now, spec.name, "failed", mp.pid, rc, mp.restarts,
                                         f"gave up after {mp.restarts} restarts"))
                    else:
                        mp.state = "crashed" if crashed else "finished"
                else:
                    mp.state = "finished"
                    self._emit(Event(now, spec.name, "finished", mp.pid, rc, mp.restarts))

    def state(self, name: str) -> str:
        return self.children[name].state

    def restarts(self, name: str) -> int:
        return self.children[name].restarts

    # ------------------------------------------------------------------------------------------------ stopping
    def signal(self, name: str, sig: int) -> None:
        """Send `sig` to a child's process group (no state change: a test's way to kill a child)."""
        mp = self.children[name]
        if mp.alive:
            os.killpg(mp.pid, sig)

    def stop_all(self, names: Sequence[str], timeout_s: float | None = None, signals: int = 1) -> None:
        """`stop` several children at once (their grace periods overlap instead of adding up)."""
        threads = [threading.Thread(target=self.stop, args=(n, timeout_s, signals), daemon=True) for n in names]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def stop(self, name: str, timeout_s: float | None = None, signals: int = 1) -> int | None:
        """Signal the child's process group `signals` times, 0.1 s apart (SIGTERM, then SIGINT: a second signal tells
        an actor to cancel its running episodes instead of finishing them; two of the same signal sent close
        together can reach Python's handler as one), wait up to timeout_s (default its spec's), then SIGKILL it. Returns the exit code (None if it never ran). A child waiting to restart is not restarted."""
        with self._lock:
            mp = self.children.get(name)
            if mp is None:
                return None
            mp.stop_requested = True
            if mp.state == "restarting":
                mp.state = "stopped"
                self._emit(Event(time.time(), name, "stopped", restarts=mp.restarts,
                                 message="stopped while waiting to restart"))
                return mp.returncode
            proc = mp.proc
        if proc is None:
            return None
        if proc.poll() is None:
            for i in range(max(signals, 1)):
                if i:
                    try:
                        proc.wait(0.1)
                        break
                    except subprocess.TimeoutExpired:
                        pass
                try:
                    os.killpg(proc.pid, signal.SIGINT if i else signal.SIGTERM)
                except ProcessLookupError:
                    pass
            try:
                proc.wait(timeout_s if timeout_s is not None else mp.spec.stop_timeout_s)
            except subprocess.TimeoutExpired:
                log.warning("process %s did not stop in time: SIGKILL", name)
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()
        _reap_group(proc.pid)
        with self._lock:
            if mp.state not in ("stopped",):
                mp.returncode = proc.returncode
                mp.state = "stopped"
                self._emit(Event(time.time(), name, "stopped", proc.pid, proc.returncode, mp.restarts))
        return proc.returncode

    def wait(self, name: str, timeout_s: float | None = None) -> int | None:
        """Wait for a child to exit by itself (no signal); returns its exit code, None on timeout."""
        mp = self.children[name]
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            if mp.state in ("finished", "crashed", "failed", "stopped"):
                return mp.returncode
            if deadline is not None and time.monotonic() > deadline:
                return None
            time.sleep(0.1)

    def close(self, order: Sequence[str] | None = None) -> None:
        """Stop every child: those named in `order` first, in that order, then the rest in reverse start order;
        then stop the monitor."""
        self._closed.set()
        names = list(order or []) + [n for n in reversed(list(self.children)) if n not in (order or [])]
        for n in names:
            if n in self.children:
                self.stop(n)
        self._monitor.join(timeout=5)

    def __enter__(self) -> "Supervisor":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _reap_group(pgid: int) -> None:
    """SIGKILL whatever is left of a stopped child's process group (e.g. grandchildren that ignored SIGTERM)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _describe(rc: int) -> str:
    if rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exit status {rc}"


def tail(path: str | Path, lines: int = 30) -> str:
    """The last lines of a log file ("" when it cannot be read)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 16384))
            return "\n".join(f.read().decode(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
