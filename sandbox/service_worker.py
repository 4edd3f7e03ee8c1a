"""The sandbox node's verify/profile worker: a process that owns an `Evaluator` for one device.

The node (sandbox.service) runs one of these per GPU (CPU backend: N on the cores) and talks to it over a
socket pair with `multiprocessing.connection` (both ends are trusted code of ours; candidate code never runs in
this process: the Evaluator's own trusted worker starts confined candidate processes).

    node -> worker  {"op": "evaluate", "job_id", "task" (Task.to_dict()), "files", "format",
                     "settings" (SandboxConfig overrides), "lock" (None or {"key", "dir", "timeout_s"})}
    worker -> node  {"op": "ready", "pid", "backend", "device", "isolation", "arch"} once, at start
                    {"op": "result", "job_id", "result" (EvalResult.to_dict()), "worker_ms"}
                    {"op": "error", "job_id", "kind" ("usage" | "internal"), "message"}
    node -> worker  {"op": "exit"}

Jobs with settings other than the node's get their own Evaluator (kept in a small LRU, `max_evaluators`),
because an Evaluator's config is fixed for the life of its trusted worker.

`WorkerProcess` is the node's handle on one such process: start, run one job with a time bound, kill, restart.
A worker that dies (killed, crashed) or does not answer in time raises `WorkerLost`; the node replaces it and
hands the job back to the queue (see sandbox.service).
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import time
import traceback
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent


class WorkerLost(RuntimeError):
    """The worker process died or stopped answering; it has been killed.

    Attributes:
      reached: True when the job had been sent to the worker (the loss may be the job's doing: it counts toward
        the node's poisoned-job bound); False when the worker was already dead, or failed to start, before the
        job reached it (not the job's doing).
    """

    def __init__(self, message: str, reached: bool = False):
        super().__init__(message)
        self.reached = reached


# ------------------------------------------------------------------------------------------------ worker side
def _die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when the node dies (Linux prctl PR_SET_PDEATHSIG)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        pass


def _evaluate(evaluators: "collections.OrderedDict[str, Any]", base: Any, msg: dict, max_evaluators: int) -> dict:
    from sandbox.evaluator import Evaluator
    from tasks.schema import Task

    overrides = msg.get("settings") or {}
    ekey = json.dumps(overrides, sort_keys=True)
    ev = evaluators.get(ekey)
    if ev is None:
        ev = Evaluator(dataclasses.replace(base, **overrides))
        evaluators[ekey] = ev
        while len(evaluators) > max_evaluators:
            _, old = evaluators.popitem(last=False)
            old.close()
    evaluators.move_to_end(ekey)
    task = Task.from_dict(msg["task"])
    t0 = time.perf_counter()
    # the trusted worker holds the lock around the timed sections only (sandbox.reference_worker._JobLock)
    res = ev.evaluate(task, msg["files"], msg["format"], timing_lock=msg.get("lock"))
    return {"op": "result", "job_id": msg["job_id"], "result": res.to_dict(),
            "worker_ms": (time.perf_counter() - t0) * 1e3}


def worker_main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="sandbox node worker (started by sandbox.service)")
    ap.add_argument("--fd", type=int, required=True)
    ap.add_argument("--config", required=True, help="SandboxConfig as JSON")
    ap.add_argument("--max-evaluators", type=int, default=2)
    args = ap.parse_args(argv)
    parent = os.getppid()
    _die_with_parent()
    if os.getppid() != parent:  # the node died before prctl took effect
        return 1
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the node decides when this worker stops (drain)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    from sandbox.config import SandboxConfig
    from sandbox.evaluator import Evaluator

    conn = Connection(args.fd)
    base = SandboxConfig(**json.loads(args.config))
    evaluators: collections.OrderedDict[str, Any] = collections.OrderedDict()
    try:
        ev = Evaluator(base)
    except Exception as e:  # noqa: BLE001 - reported to the node, which logs it and retries later
        conn.send({"op": "error", "job_id": "", "kind": "internal", "message": f"{type(e).__name__}: {e}"})
        return 1
    evaluators[json.dumps({})] = ev
    conn.send({"op": "ready", "pid": os.getpid(), "backend": ev.backend, "device": ev.device,
               "isolation": ev.isolation_mode, "arch": ev.arch})
    try:
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                break
            if msg.get("op") == "exit":
                break
            if msg.get("op") != "evaluate":
                conn.send({"op": "error", "job_id": msg.get("job_id", ""), "kind": "internal",
                           "message": f"unknown op {msg.get('op')!r}"})
                continue
            try:
                out = _evaluate(evaluators, base, msg, max(1, args.max_evaluators))
            except ValueError as e:
                out = {"op": "error", "job_id": msg["job_id"], "kind": "usage", "message": str(e)}
            except Exception as e:  # noqa: BLE001 - a sandbox bug: the node answers internal_error and keeps serving
                out = {"op": "error", "job_id": msg["job_id"], "kind": "internal",
                       "message": f"{type(e).__name__}: {e}\n{traceback.format_exc()[-2000:]}"}
            conn.send(out)
    finally:
        for e in evaluators.values():
            try:
                e.close()
            except Exception:  # noqa: BLE001
                pass
    return 0


# ------------------------------------------------------------------------------------------------ node side
class WorkerProcess:
    """The node's handle on one worker process (not thread-safe: one node slot thread owns it).

    Args:
      name: for logs ("w0").
      sandbox_config: the node's SandboxConfig as a plain dict (dataclasses.asdict).
      env: extra environment (e.g. CUDA_VISIBLE_DEVICES for a GPU worker).
      max_evaluators: Evaluators kept per worker (one per distinct job settings).
      start_timeout_s: how long the worker may take to come up (it probes the isolation on start).
    """

    def __init__(self, name: str, sandbox_config: dict[str, Any], env: dict[str, str] | None = None,
                 max_evaluators: int = 2, start_timeout_s: float = 180.0):
        self.name = name
        self.sandbox_config = sandbox_config
        self.env = env or {}
        self.max_evaluators = max_evaluators
        self.start_timeout_s = start_timeout_s
        self.proc: subprocess.Popen | None = None
        self.conn: Connection | None = None
        self.info: dict[str, Any] = {}
        self.has_job = False  # a job was sent and its answer has not come back yet (the node's status shows it)

    @property
    def pid(self) -> int | None:
        proc = self.proc  # read once: kill() may set it to None from the slot thread while the status reads it
        return proc.pid if proc is not None else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> dict[str, Any]:
        """Start the process and wait for its "ready" message (returned). Raises WorkerLost when it fails."""
        a, b = socket.socketpair()
        env = dict(os.environ, **self.env)
        env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "sandbox.service_worker", "--fd", str(b.fileno()),
                 "--config", json.dumps(self.sandbox_config), "--max-evaluators", str(self.max_evaluators)],
                pass_fds=(b.fileno(),), env=env, stdin=subprocess.DEVNULL,
                start_new_session=True)  # its own process group: killed as a whole, and no terminal's Ctrl-C
        finally:
            b.close()
        self.conn = Connection(a.detach())
        if not self.conn.poll(self.start_timeout_s):
            self.kill()
            raise WorkerLost(f"worker {self.name} did not start within {self.start_timeout_s:.0f} s")
        try:
            msg = self.conn.recv()
        except (EOFError, OSError):
            code = self.kill()
            raise WorkerLost(f"worker {self.name} exited while starting (exit code {code})") from None
        if msg.get("op") != "ready":
            self.kill()
            raise WorkerLost(f"worker {self.name} failed to start: {msg.get('message', msg)}")
        self.info = msg
        return msg

    def run(self, job: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """Send one job and wait for its answer ("result" or "error" message). Raises WorkerLost when the process
        dies or does not answer within `timeout_s` (it is killed then); its `reached` says whether the job had been
        sent (a worker found dead before that is not the job's doing)."""
        if self.proc is None or self.conn is None:
            raise WorkerLost(f"worker {self.name} is not running")
        if not self.alive():  # died while the node waited for the job's prebuild, or idle before it
            raise WorkerLost(f"worker {self.name} died before the job reached it ({_describe_exit(self.kill())})")
        sent = False
        try:
            self.conn.send(job)
            sent = self.has_job = True
            deadline = time.monotonic() + timeout_s
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    self.kill()
                    raise WorkerLost(f"worker {self.name} gave no answer within {timeout_s:.0f} s; killed",
                                     reached=True)
                if self.conn.poll(min(left, 1.0)):
                    return self.conn.recv()
                if not self.alive():
                    break
        except (EOFError, OSError, BrokenPipeError):
            pass
        finally:
            self.has_job = False
        code = self.kill()
        if not sent:  # the send failed: it died after the check above
            raise WorkerLost(f"worker {self.name} died before the job reached it ({_describe_exit(code)})")
        raise WorkerLost(f"worker {self.name} died mid-job ({_describe_exit(code)})", reached=True)

    def kill(self) -> int | None:
        """Kill the worker's whole process group; returns its exit code."""
        code = None
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                code = self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                code = None
        if self.conn is not None:
            self.conn.close()
        self.proc = self.conn = None
        return code

    def stop(self, timeout_s: float = 15.0) -> None:
        """Ask the worker to exit (it closes its Evaluators), kill it if it does not."""
        if self.alive() and self.conn is not None:
            try:
                self.conn.send({"op": "exit"})
                self.proc.wait(timeout=timeout_s)  # type: ignore[union-attr]
            except (OSError, BrokenPipeError, subprocess.TimeoutExpired):
                pass
        self.kill()


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "exit status unknown"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


if __name__ == "__main__":
    sys.exit(worker_main())
