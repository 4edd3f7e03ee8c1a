"""The build stage of the sandbox node's pipeline: a pool of threads on the CPU cores that compiles queued jobs
(host compiler, nvcc) ahead of the verify/profile workers.

It only warms the content-addressed build cache of sandbox.build: when a verify/profile worker later evaluates
the job, its build step is a cache hit (milliseconds) and the GPU is not left idle while nvcc runs. Correctness
never depends on it: the Evaluator repeats the static checks and builds on a cache miss, and a failed build is
cached too, so a compile error comes back from the worker at once. The compilers run confined exactly as the
Evaluator runs them (same isolation mode, uid and jail spec, taken from an `Evaluator` that never evaluates).
The `extension` format is not prebuilt (its build needs torch and a GPU toolchain inside the worker).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import time
from typing import Any

from sandbox.build import build, jail_for_build
from sandbox.config import SandboxConfig
from sandbox.static_check import check_kernel_sources, check_model_new
from sandbox.workspace import Workspace, WorkspaceError
from tasks.schema import Task

log = logging.getLogger(__name__)

PREBUILT_FORMATS = ("cpu", "cubin")


@dataclasses.dataclass
class PrebuildOutcome:
    """status: "ok" | "compile_error" | "forbidden" | "timeout" | "skipped" | "error"; cached: the cache had it;
    elapsed_ms: wall time of the build stage."""

    status: str
    cached: bool = False
    elapsed_ms: float = 0.0
    message: str = ""


class Prebuilder:
    """Thread pool that runs `prebuild` for queued jobs.

    Args:
      config: the node's SandboxConfig (backend resolved to "cpu" or "cuda").
      threads: pool size (build jobs in parallel).
    """

    def __init__(self, config: SandboxConfig, threads: int):
        from sandbox.evaluator import Evaluator

        if threads < 1:
            raise ValueError(f"Prebuilder: threads must be >= 1, got {threads}")
        self.cfg = config
        self._ev = Evaluator(config)  # isolation mode, jail uid and arch only: it never starts a trusted worker
        self.pool = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="sandbox-build")

    def submit(self, task: Task, files: dict[str, str], fmt: str, config: SandboxConfig | None = None
               ) -> concurrent.futures.Future:
        """Queue a build; the Future resolves to a PrebuildOutcome (never raises)."""
        return self.pool.submit(self.prebuild, task, files, fmt, config or self.cfg)

    def prebuild(self, task: Task, files: dict[str, str], fmt: str, cfg: SandboxConfig) -> PrebuildOutcome:
        t0 = time.perf_counter()
        if fmt not in PREBUILT_FORMATS:
            return PrebuildOutcome("skipped")
        ev = self._ev
        owner = ev.jail_uid if (ev.isolation_mode == "namespaces" and (ev.jail_uid or 0) > 0) else -1
        try:
            ws = Workspace.create(cfg.workspaces_dir, task.reference, files, fmt, owner_uid=owner)
        except WorkspaceError as e:
            return PrebuildOutcome("skipped", message=str(e))
        except Exception as e:  # noqa: BLE001 - a full disk, say: the worker will report it
            log.warning("prebuild: workspace failed: %s", e)
            return PrebuildOutcome("error", message=str(e))
        try:
            viol, syntax = check_model_new(files["model_new.py"], fmt)
            if syntax or viol or check_kernel_sources(files, fmt):
                return PrebuildOutcome("skipped", message="static check fails; nothing to build")
            jail = jail_for_build(ws, cfg) if ev.isolation_mode == "namespaces" else None
            if jail is not None:
                jail.uid = ev.jail_uid if ev.jail_uid is not None else -1
            b = build(ws, fmt, cfg, jail, ev.arch)
            return PrebuildOutcome("ok" if b.ok else (b.status or "compile_error"), cached=b.cached,
                                   elapsed_ms=(time.perf_counter() - t0) * 1e3)
        except Exception as e:  # noqa: BLE001 - never fatal: the worker builds again
            log.warning("prebuild of %s failed: %s", task.id, e)
            return PrebuildOutcome("error", message=f"{type(e).__name__}: {e}")
        finally:
            ws.cleanup()

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)

