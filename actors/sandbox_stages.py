"""The sandbox as the agent's tools use it: one async call per stage (compile, verify, profile, final) through
the sandbox node client (`sandbox.client.SandboxClient`: many nodes, resend on timeout, never hangs).

A stage is a `SandboxJob` whose `settings` select what runs (see `actors.config.StagesConfig`): compile =
`build_only`, verify = `profile: false`, profile and final = a full evaluation. Job ids are stable per call,
so the client's resend to another node is idempotent.

Failure of the sandbox itself (no node alive for `unavailable_after_s`, the job's deadline, a refused job)
raises `SandboxUnavailable`; the episode then ends with status `sandbox_error` rather than teaching the
policy from a meaningless reward. Faults of the candidate are statuses inside the returned `EvalResult`.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from actors.activity import ActivityClock
from actors.config import StagesConfig
from protocol.sandbox_jobs import SandboxJob
from sandbox.client import SandboxClient, SandboxClientError
from sandbox.result import EvalResult
from tasks.schema import Task

STAGES = ("compile", "verify", "profile", "final")


class SandboxUnavailable(RuntimeError):
    """A stage got no usable answer from any sandbox node. code: the client's error code ("timeout", "busy",
    "bad_message", "gone", "internal", "version"), "unavailable" (no node alive) or "bad_result"."""

    def __init__(self, code: str, message: str):
        super().__init__(f"sandbox {code}: {message}")
        self.code = code


class SandboxStages:
    """Runs agent stages on sandbox nodes. client: a SandboxClient over one or many nodes; clock: where busy
    time is recorded (activity "sandbox")."""

    def __init__(self, client: SandboxClient, config: StagesConfig | None = None, clock: ActivityClock | None = None):
        self.client = client
        self.cfg = config or StagesConfig()
        self.clock = clock
        self.calls = {s: 0 for s in STAGES}
        self.failures = 0

    def settings(self, stage: str) -> dict[str, Any]:
        c = self.cfg
        return dict({"compile": c.compile_settings, "verify": c.verify_settings, "profile": c.profile_settings,
                     "final": c.final_settings}[stage])

    def deadline_s(self, stage: str) -> float:
        c = self.cfg
        return {"compile": c.compile_deadline_s, "verify": c.verify_deadline_s}.get(stage, c.profile_deadline_s)

    def backend(self, timeout_s: float = 30.0) -> str | None:
        """The backend ("cpu" | "cuda") the first live node reports, waiting up to timeout_s; None if none."""
        deadline = time.monotonic() + timeout_s
        while True:
            for n in self.client.nodes().values():
                if n["alive"] and n["status"].get("backend"):
                    return str(n["status"]["backend"])
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.05)

    def any_node_alive(self) -> bool:
        return any(n["alive"] for n in self.client.nodes().values())

    async def run(self, stage: str, task: Task, files: dict[str, str], fmt: str, job_id: str) -> EvalResult:
        """Evaluate `files` at `stage`. Returns the EvalResult; raises SandboxUnavailable (see module doc)."""
        if stage not in STAGES:
            raise ValueError(f"unknown stage {stage!r} (expected one of {STAGES})")
        self.calls[stage] += 1
        job = SandboxJob(job_id=job_id, task=task.to_dict(), files=dict(files), format=fmt,
                         settings=self.settings(stage), priority=self.cfg.priority, deadline_s=self.deadline_s(stage))
        if self.clock is not None:
            self.clock.start("sandbox")
        try:
            return await self._wait(job)
        except SandboxUnavailable:
            self.failures += 1
            raise
        finally:
            if self.clock is not None:
                self.clock.stop("sandbox")

    async def _wait(self, job: SandboxJob) -> EvalResult:
        future = self.client.submit(job)
        waiter = asyncio.wrap_future(future)
        dead_since: float | None = None
        backstop = time.monotonic() + job.deadline_s + 30.0
        while True:
            done, _ = await asyncio.wait({waiter}, timeout=0.5)
            if done:
                break
            now = time.monotonic()
            if self.any_node_alive():
                dead_since = None
            elif dead_since is None:
                dead_since = now
            if (dead_since is not None and now - dead_since >= self.cfg.unavailable_after_s) or now > backstop:
                future.cancel()
                waiter.cancel()
                why = (f"no sandbox node alive for {self.cfg.unavailable_after_s:g} s" if now <= backstop
                       else f"no answer within {job.deadline_s:g} s")
                raise SandboxUnavailable("unavailable", f"job {job.job_id}: {why}")
        try:
            reply = waiter.result()
        except SandboxClientError as e:
            raise SandboxUnavailable(e.code, str(e)) from None
        try:
            return EvalResult.from_dict(dict(reply.result))
        except (ValueError, TypeError, KeyError) as e:
            raise SandboxUnavailable("bad_result", f"job {job.job_id}: node {reply.node_id} sent a malformed result: "
                                                   f"{e}") from None
