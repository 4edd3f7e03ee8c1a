"""Client of sandbox nodes, used by actors: one call gives a `SandboxResult` or a clear `SandboxClientError`.

    from sandbox.client import SandboxClient
    with SandboxClient(["tcp://node-a:5557", "tcp://node-b:5557"]) as client:
        res = client.evaluate(task, {"model_new.py": ..., "kernels/k.cu": ...}, "cubin", deadline_s=300)
        res.status, res.result["reward"]

Built on `protocol.rpc.RpcClient` (one DEALER per node, heartbeats):
- spreads jobs by free capacity: each node's heartbeat answer carries its free slots (workers - running -
  queued), less what this client has sent it since;
- a node that answers "busy" (queue full, draining) is skipped until its retry time, without using up a try;
- a node silent for `liveness` heartbeats is marked dead, its jobs move to another node at once, and it is
  taken back as soon as it answers again;
- a job with no answer within `attempt_timeout_s` is resent to another node (same job id: nodes are
  idempotent by job id, and a node that ran it answers from memory);
- never hangs: every call ends by `deadline_s` (default attempts x attempt timeout) with a result or an error.
"""

from __future__ import annotations

import concurrent.futures
import time
import uuid
from pathlib import Path
from typing import Any, Sequence

from protocol.auth import CurveClient
from protocol.rpc import RpcClient, RpcError, RpcTimeout
from protocol.sandbox_jobs import SandboxJob, SandboxResult

PRIORITY_EVALUATION = 0
PRIORITY_TRAINING = 1


class SandboxClientError(RuntimeError):
    """A job ended without a result. code: "timeout" (no node answered in time), "busy" (every node stayed
    busy until the deadline), "bad_message" (the node refused the job: `field` names the part), "gone" (its
    deadline passed in a queue), "internal", "version"; job_id: the job."""

    def __init__(self, code: str, message: str, job_id: str = "", field: str = ""):
        super().__init__(f"sandbox job {job_id}: {code}: {message}" + (f" (field {field})" if field else ""))
        self.code = code
        self.job_id = job_id
        self.field = field


class SandboxClient:
    """Connects to one or many sandbox nodes (see the module doc).

    Args:
      endpoints: node addresses, e.g. ["tcp://10.0.0.5:5557"].
      client_id: this client's name in the nodes' logs.
      attempts: tries per job (a timeout uses one; a busy reply does not).
      attempt_timeout_s: wait for one try before resending elsewhere; None = the job's deadline_s / attempts.
      heartbeat_s, liveness: a node silent for liveness x heartbeat_s seconds is dead until it answers again.
      curve_secret_key, server_public_key: CURVE key files (needed for nodes that bind beyond loopback).
    """

    def __init__(self, endpoints: Sequence[str], *, client_id: str = "sandbox-client", attempts: int = 3,
                 attempt_timeout_s: float | None = None, heartbeat_s: float = 1.0, liveness: int = 3,
                 curve_secret_key: str | Path | None = None, server_public_key: str | Path | None = None):
        if attempts < 1:
            raise ValueError("SandboxClient: attempts must be >= 1")
        if (curve_secret_key is None) != (server_public_key is None):
            raise ValueError("SandboxClient: give both curve_secret_key and server_public_key, or neither")
        curve = CurveClient(Path(curve_secret_key), Path(server_public_key)) if curve_secret_key else None
        self.endpoints = list(endpoints)
        self.attempts = attempts
        self.attempt_timeout_s = attempt_timeout_s
        self.rpc = RpcClient(self.endpoints, expect=(SandboxResult,), client_id=client_id, heartbeat_s=heartbeat_s,
                             liveness=liveness, curve=curve)

    # ------------------------------------------------------------------------------------------ jobs
    def submit(self, job: SandboxJob) -> concurrent.futures.Future:
        """Send `job`; the Future gives the SandboxResult or fails with SandboxClientError by about
        job.deadline_s (attempts x attempt_timeout_s when that is set)."""
        timeout = self.attempt_timeout_s or job.deadline_s / self.attempts
        inner = self.rpc.submit(job, timeout_s=timeout, attempts=self.attempts)
        outer: concurrent.futures.Future = concurrent.futures.Future()
        outer.job_id = job.job_id  # type: ignore[attr-defined]
        outer.give_up_s = timeout * self.attempts  # type: ignore[attr-defined]

        def done(f: concurrent.futures.Future) -> None:
            if f.cancelled():
                outer.cancel()
                return
            err = f.exception()
            try:
                if err is None:
                    outer.set_result(f.result())
                elif isinstance(err, RpcError):
                    outer.set_exception(SandboxClientError(err.error.code, err.error.message, job.job_id,
                                                           err.error.field))
                elif isinstance(err, RpcTimeout):
                    outer.set_exception(SandboxClientError("timeout", str(err), job.job_id))
                else:
                    outer.set_exception(SandboxClientError("internal", f"{type(err).__name__}: {err}", job.job_id))
            except concurrent.futures.InvalidStateError:  # the caller cancelled it (an aborted episode): nobody waits
                pass

        inner.add_done_callback(done)
        return outer

    def run(self, job: SandboxJob) -> SandboxResult:
        """`submit(job)` and wait: the SandboxResult, or SandboxClientError. Never waits past the give-up time."""
        fut = self.submit(job)
        try:
            return fut.result(timeout=fut.give_up_s + 30.0)  # type: ignore[attr-defined]
        except concurrent.futures.TimeoutError:
            raise SandboxClientError("timeout", "no answer (client-side backstop)", job.job_id) from None

    def evaluate(self, task: Any, files: dict[str, str], fmt: str, *, settings: dict[str, Any] | None = None,
                 priority: int = PRIORITY_TRAINING, deadline_s: float = 600.0, job_id: str | None = None
                 ) -> SandboxResult:
        """Evaluate one solution. task: a `tasks.schema.Task` or its dict; files: {workspace path: text};
        fmt: "cubin" | "extension" | "cpu"; priority: PRIORITY_EVALUATION (0) or PRIORITY_TRAINING (1);
        job_id: a stable id makes a resend idempotent (default: a fresh uuid).

        Returns the SandboxResult (`.result` is `EvalResult.to_dict()`). Raises SandboxClientError.
        """
        task_d = task.to_dict() if hasattr(task, "to_dict") else dict(task)
        job = SandboxJob(job_id=job_id or uuid.uuid4().hex, task=task_d, files=dict(files), format=fmt,
                         settings=dict(settings or {}), priority=priority, deadline_s=deadline_s)
        return self.run(job)

    # ------------------------------------------------------------------------------------------ nodes
    def nodes(self) -> dict[str, dict[str, Any]]:
        """Per node: alive, busy, outstanding (this client's jobs there), status (its last heartbeat: free,
        queued, running, workers, worker_pids, counts, worker_busy_s, gpu_util_s, gpu_time_s, ...)."""
        return self.rpc.endpoint_status()

    def wait_for_nodes(self, count: int | None = None, timeout_s: float = 60.0) -> bool:
        """Wait until `count` nodes (default all) are alive and have all their workers up."""
        count = len(self.endpoints) if count is None else count
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            up = [n for n in self.nodes().values() if n["alive"] and n["status"]
                  and n["status"].get("workers_ready", 0) >= n["status"].get("workers", 1)]
            if len(up) >= count:
                return True
            time.sleep(0.1)
        return False

    def close(self) -> None:
        self.rpc.close()

    def __enter__(self) -> "SandboxClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
