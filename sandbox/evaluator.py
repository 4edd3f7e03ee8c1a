"""The sandbox's library API: `Evaluator(config).evaluate(task, files, fmt) -> EvalResult`.

    from sandbox.evaluator import Evaluator
    from sandbox.config import SandboxConfig
    with Evaluator(SandboxConfig(backend="cpu")) as ev:
        result = ev.evaluate(task, {"model_new.py": ..., "kernels/k.cpp": ...}, "cpu")

Pipeline (stage timings in `EvalResult.stage_ms`):
  workspace     lay out model.py (read-only copy), model_new.py, kernels/ (sandbox.workspace)
  static_check  model_new.py rules and kernel source rules (sandbox.static_check)
  build         compile with the content-hash cache, confined (sandbox.build)
  reference / load / verify / profile
                in the long-lived trusted worker (sandbox.reference_worker), which starts the confined candidate
                worker (sandbox.candidate) per evaluation
One Evaluator owns one trusted worker process (spawned on first use, replaced if it dies) for one device;
`evaluate` is thread-safe (calls are serialised). The node service (sandbox/service.py) wraps this.

Errors: ValueError for usage errors (unknown format, a format the backend cannot run); every fault of the
candidate is a status in the returned EvalResult, and faults of the sandbox itself are `internal_error`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from sandbox import jail as jail_mod
from sandbox.build import build, detect_arch, jail_for_build
from sandbox.config import FORMATS, SandboxConfig
from sandbox.result import EvalResult, Status, TimingStats, TrialResult, Violation
from sandbox.static_check import check_kernel_sources, check_model_new
from sandbox.workspace import Workspace, WorkspaceError
from tasks.schema import Task

REPO_ROOT = Path(__file__).resolve().parent.parent
_CUDA_PROBE = "import torch; assert torch.cuda.is_available(); torch.zeros(1, device='cuda').sum().item()"


def resolve_backend(backend: str) -> str:
    """"auto" -> "cuda" when torch sees a GPU, else "cpu"."""
    if backend != "auto":
        return backend
    try:
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    except Exception:  # noqa: BLE001
        return "cpu"


def shape_variants(shape_params: dict[str, int]) -> list[dict[str, int]]:
    """Other shapes to verify on: every shape parameter roughly halved and made odd (so no size is a multiple of a
    typical block size), e.g. {"batch_size": 64, "dim": 16384} -> [{"batch_size": 33, "dim": 8193}]. Empty when the
    task declares no shape parameters or the variant equals the default."""
    if not shape_params:
        return []
    v = {k: max(1, (int(n) // 2) | 1) for k, n in shape_params.items()}
    return [] if v == dict(shape_params) else [v]


def check_format(fmt: str, backend: str) -> None:
    """Raise ValueError when `fmt` is unknown or cannot run on `backend`."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown solution format {fmt!r} (expected one of {FORMATS})")
    if fmt == "cpu" and backend != "cpu":
        raise ValueError("the cpu format runs on the cpu backend only (use --backend cpu)")
    if fmt == "cubin" and backend != "cuda":
        raise ValueError("the cubin format needs the cuda backend (a GPU)")


class Evaluator:
    """Builds, verifies, profiles and rewards solutions (see module doc). Close it (or use `with`)."""

    def __init__(self, config: SandboxConfig | None = None):
        self.cfg = config or SandboxConfig()
        self.backend = resolve_backend(self.cfg.backend)
        self.device = "cuda:0" if self.backend == "cuda" else "cpu"
        self._lock = threading.Lock()
        self._proc: Any = None
        self._conn: Any = None
        self.isolation_mode, self.jail_uid, self.isolation_note = self._choose_isolation()
        self.arch = detect_arch(self.cfg) if self.backend == "cuda" or self.cfg.cuda_arch else self.cfg.default_cuda_arch

    # ------------------------------------------------------------------ isolation
    def _choose_isolation(self) -> tuple[str, int | None, str]:
        if self.cfg.isolation == "none":
            return "none", None, "isolation disabled by configuration"
        check = _CUDA_PROBE if self.backend == "cuda" else "import torch"
        uids = [self.cfg.sandbox_uid] + ([-1] if self.cfg.sandbox_uid > 0 else [])
        reasons = []
        for uid in uids:
            ok, why = jail_mod.probe(uid, check)
            if ok:
                return "namespaces", uid, "" if uid == uids[0] else f"uid {uids[0]} failed ({reasons[-1]}); kept uid 0 without capabilities"
            reasons.append(why)
        if self.cfg.isolation == "namespaces":
            raise RuntimeError(f"namespace isolation is unavailable here: {reasons[-1]}")
        return "none", None, f"namespace isolation unavailable ({reasons[-1]}); rlimits and process groups only"

    # ------------------------------------------------------------------ trusted worker
    def _ensure_worker(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            return
        # A plain subprocess (not multiprocessing's spawn), so callers need no `if __name__ == "__main__"` guard.
        a, b = socket.socketpair()
        # the allocator regime of both sides (sandbox.jail.MALLOC_ENV): the host's own allocator settings, which the
        # candidate's environment never gets, do not reach the baselines either
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("MALLOC_") and k not in ("GLIBC_TUNABLES", "LD_PRELOAD")}
        env.update(jail_mod.MALLOC_ENV, PYTHONPATH=str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        p = subprocess.Popen([sys.executable, "-m", "sandbox.reference_worker", "--fd", str(b.fileno()),
                              "--config", json.dumps(dataclasses.asdict(self.cfg))], pass_fds=(b.fileno(),), env=env,
                             stdin=subprocess.DEVNULL)
        b.close()
        self._proc, self._conn = p, Connection(a.detach())

    def _stop_worker(self) -> None:
        if self._proc is None:
            return
        try:
            self._conn.send({"op": "exit"})
        except (OSError, ValueError):
            pass
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(timeout=5)
        self._conn.close()
        self._proc = self._conn = None

    def close(self) -> None:
        """Stop the trusted worker."""
        with self._lock:
            self._stop_worker()

    def __enter__(self) -> "Evaluator":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _job_timeout(self, load_timeout: float, timing_lock: dict | None = None) -> float:
        c = self.cfg
        # with a lock: its two timed sections' waits, and a wait for another timer at each step of the shared work
        lock_s = (c.num_trials + 5) * float(timing_lock["timeout_s"]) if timing_lock else 0.0
        return c.reference_timeout_s + load_timeout + c.num_trials * c.trial_timeout_s * 1.5 + \
            c.profile_timeout_s + 60.0 + lock_s

    # ------------------------------------------------------------------ evaluate
    def evaluate(self, task: Task, files: dict[str, str], fmt: str, timing_lock: dict | None = None) -> EvalResult:
        """Evaluate one solution (files: {workspace-relative path: text}) in format fmt on this backend.

        timing_lock: the device's timing lock (sandbox.service_lock) as {"key", "dir", "timeout_s"}, or None: the
        trusted worker holds it exclusively around the timed sections (calibration, profile) and shared around the
        untimed GPU work (reference stage, verification); a timed section that could not have it within timeout_s
        runs anyway and the result is flagged `contended`. stage_ms gets timing_lock_wait (the timed sections'
        waits) and timing_lock_shared_wait, ms.
        Raises ValueError for usage errors (see module doc); everything else is a status in the result.
        """
        check_format(fmt, self.backend)
        with self._lock:
            return self._evaluate(task, files, fmt, timing_lock)

    def _evaluate(self, task: Task, files: dict[str, str], fmt: str, timing_lock: dict | None = None) -> EvalResult:
        cfg = self.cfg
        t_start = time.perf_counter()
        stage: dict[str, float] = {}
        iso = jail_mod.describe(self.isolation_mode, jail_mod.JailSpec(
            workspace="", uid=self.jail_uid if self.jail_uid is not None else -1,
            rlimits={"cpu_s": cfg.rlimit_cpu_s, "fsize_bytes": cfg.rlimit_fsize_bytes, "nofile": cfg.rlimit_nofile,
                     "nproc": cfg.rlimit_nproc if (self.jail_uid or 0) > 0 else 0}))
        if self.isolation_note:
            iso["note"] = self.isolation_note
        base = dict(task_id=task.id, format=fmt, backend=self.backend, isolation=iso)

        def finish(res: EvalResult) -> EvalResult:
            stage["total"] = (time.perf_counter() - t_start) * 1e3
            res.stage_ms = {**stage, **res.stage_ms}
            return res

        owner = self.jail_uid if (self.isolation_mode == "namespaces" and (self.jail_uid or 0) > 0) else -1
        t = time.perf_counter()
        try:
            ws = Workspace.create(cfg.workspaces_dir, task.reference, files, fmt, owner_uid=owner)
        except WorkspaceError as e:
            return finish(EvalResult.failure(Status.COMPILE_ERROR, f"workspace: {e}", **base))
        stage["workspace"] = (time.perf_counter() - t) * 1e3
        try:
            # ---------------------------------------------------------- static checks
            t = time.perf_counter()
            viol, syntax = check_model_new(files["model_new.py"], fmt)
            viol += check_kernel_sources(files, fmt)
            if not cfg.static_checks:
                viol = []
            stage["static_check"] = (time.perf_counter() - t) * 1e3
            if syntax:
                return finish(EvalResult.failure(Status.LOAD_ERROR, syntax, violations=viol, **base))
            if viol:
                return finish(EvalResult.failure(Status.FORBIDDEN, f"static check: {viol[0].detail}", violations=viol,
                                                 **base))
            # ---------------------------------------------------------- build
            t = time.perf_counter()
            jail = jail_for_build(ws, cfg) if self.isolation_mode == "namespaces" else None
            if jail is not None:
                jail.uid = self.jail_uid if self.jail_uid is not None else -1
            b = build(ws, fmt, cfg, jail, self.arch)
            stage["build"] = (time.perf_counter() - t) * 1e3
            if not b.ok:
                st = Status(b.status or "compile_error")
                msg = {"compile_error": "build failed: " + (b.log.strip().splitlines() or ["?"])[0],
                       "timeout": f"build ran past its time limit",
                       "forbidden": "built library: " + (b.violations[0].detail if b.violations else "")}[st.value]
                return finish(EvalResult.failure(st, msg, compile_log=b.log, build_cached=b.cached,
                                                 violations=b.violations, **base))
            if cfg.build_only:
                return finish(EvalResult(status=Status.OK.value, reward=0.0, compile_log=b.log, build_cached=b.cached,
                                         message="built (build_only: not verified or profiled)", **base))
            # ---------------------------------------------------------- trusted worker: reference, load, verify, profile
            writable: list[str] = [str(ws.io_dir)]  # the spill folder, beside the workspace (sandbox.workspace)
            extra_env: dict[str, str] = {}
            load_timeout = cfg.load_timeout_s
            if fmt == "extension" and not b.manifest_path:
                inline = self._inline_cache_dir(files["model_new.py"], owner)
                writable.append(str(inline))
                extra_env["TORCH_EXTENSIONS_DIR"] = str(inline)
                extra_env["TORCH_CUDA_ARCH_LIST"] = _torch_arch(self.arch)
                extra_env["MAX_JOBS"] = str(max(1, min(8, os.cpu_count() or 1)))
                load_timeout = cfg.extension_build_timeout_s
            job = {
                "op": "evaluate", "task_id": task.id, "reference": task.reference,
                "reference_hash": task.content_hash, "shape_overrides": {},
                "shape_variants": shape_variants(task.shape_params) if cfg.shape_variants else [],
                "atol": cfg.tolerances(task.atol, task.rtol)[0], "rtol": cfg.tolerances(task.atol, task.rtol)[1],
                "workspace": str(ws.path), "io_dir": str(ws.io_dir), "model_py": str(ws.model_py),
                "manifest": b.manifest_path,
                "format": fmt, "device": self.device,
                "jail_uid": self.jail_uid if self.isolation_mode == "namespaces" else None,
                "writable": writable, "extra_env": extra_env, "load_timeout_s": load_timeout,
                "timing_lock": timing_lock,
            }
            out = self._call_worker(job, self._job_timeout(load_timeout, timing_lock))
            res = self._assemble(out, base, b)
            return finish(res)
        finally:
            if not cfg.keep_workspaces:
                ws.cleanup()

    def _inline_cache_dir(self, model_new: str, owner: int) -> Path:
        root = Path(self.cfg.cache_dir).parent / "sandbox-inline"
        root.mkdir(parents=True, exist_ok=True)
        os.chmod(root, 0o711)
        d = root / hashlib.sha256(model_new.encode()).hexdigest()[:32]
        d.mkdir(exist_ok=True)
        if owner > 0:
            os.chown(d, owner, owner)
        return d

    def _call_worker(self, job: dict, timeout_s: float) -> dict:
        for attempt in range(2):
            self._ensure_worker()
            try:
                self._conn.send(job)
                if not self._conn.poll(timeout_s):
                    self._stop_worker_hard()
                    return {"status": Status.INTERNAL_ERROR.value,
                            "message": f"trusted worker did not answer within {timeout_s:.0f} s; replaced"}
                return self._conn.recv()
            except (EOFError, OSError, BrokenPipeError):
                self._stop_worker_hard()
                if attempt == 1:
                    return {"status": Status.INTERNAL_ERROR.value, "message": "trusted worker died twice; replaced"}
        return {"status": Status.INTERNAL_ERROR.value, "message": "unreachable"}

    def _stop_worker_hard(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait(timeout=5)
            self._conn.close()
        self._proc = self._conn = None

    def _assemble(self, out: dict, base: dict, b: Any) -> EvalResult:
        status = out.get("status", Status.INTERNAL_ERROR.value)
        ok = status == Status.OK.value
        log = list(out.get("log", []))
        if out.get("detail"):
            log.append(out["detail"])
        res = EvalResult(
            status=status, reward=float(out.get("reward", 0.0)) if ok else -1.0, message=out.get("message", ""),
            compile_log=b.log, build_cached=b.cached,
            trials=[TrialResult.from_dict(t) for t in out.get("trials", [])],
            timing=TimingStats.from_dict(out["timing"]) if out.get("timing") else None,
            violations=[Violation.from_dict(v) for v in out.get("violations", [])],
            nvml=list(out.get("nvml", [])), log=log, contended=bool(out.get("contended", False)),
            device_peak_bytes=int(out.get("device_peak_bytes", 0) or 0),
            device_free_fraction=float(out.get("device_free_fraction", -1.0)), **base,
        )
        res.stage_ms.update(out.get("stage_ms", {}))
        return res


def _torch_arch(arch: str) -> str:
    from sandbox.build import torch_arch_list

    return torch_arch_list(arch)
