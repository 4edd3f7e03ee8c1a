"""Shared parts of the node service tests: the corpus, quick evaluation settings, nodes as real processes."""

from __future__ import annotations

import os
import socket
import time
import uuid
from pathlib import Path
from typing import Any

import psutil

from protocol.sandbox_jobs import SandboxJob
from sandbox.stress import DEFAULT_CORPUS, DEFAULT_HOSTILE, LocalNode, Solution, load_corpus

TASK = "elementwise_chain"
#: Cheap but real evaluations: no torch.compile baseline, few repetitions, two checks.
QUICK = {"use_compile": False, "reps": 5, "num_trials": 2, "warmup_calls": 1, "bootstrap_samples": 200,
         "trial_timeout_s": 20.0}
#: Node options every test node uses (CPU backend, one worker, quick logs).
NODE = ["sandbox.backend=cpu", "workers=1", "log_interval_s=2"]


def corpus(hostile: bool = False) -> dict[str, Solution]:
    """The elementwise_chain solutions of the corpus by name ("fast", "wrong", ..., "hostile/<name>")."""
    sols = load_corpus(DEFAULT_CORPUS, "cpu", DEFAULT_HOSTILE if hostile else None, [TASK])
    out = {}
    for kind, items in sols.items():
        for s in items:
            out[s.name.split("/", 1)[1]] = s
    return out


def job(sol: Solution, *, salt: str | None = None, job_id: str | None = None, priority: int = 1,
        deadline_s: float = 300.0, settings: dict[str, Any] | None = None, files: dict[str, str] | None = None
        ) -> SandboxJob:
    st = dict(QUICK if settings is None else settings)
    if salt is not None:
        st["cache_salt"] = salt
    return SandboxJob(job_id=job_id or uuid.uuid4().hex, task=sol.task, files=files or sol.files, format=sol.format,
                      settings=st, priority=priority, deadline_s=deadline_s)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_node(tmp_path: Path, *extra: str, name: str = "node", netns: str | None = None) -> LocalNode:
    return LocalNode([*NODE, *extra], log_path=tmp_path / f"{name}.log", netns=netns)


def wait_until(pred, timeout_s: float, what: str, period_s: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(period_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def node_status(client, endpoint: str) -> dict[str, Any]:
    return client.nodes()[endpoint]["status"]


def rss_bytes(pid: int) -> int:
    return psutil.Process(pid).memory_info().rss


def nobody_processes() -> list[str]:
    """Command lines of the live (not zombie) processes of the sandbox uid (65534)."""
    out = []
    for p in psutil.process_iter(["uids", "cmdline", "status"]):
        info = p.info
        if info["uids"] and info["uids"].real == 65534 and info["status"] != psutil.STATUS_ZOMBIE:
            out.append(" ".join(info["cmdline"] or []))
    return out


def is_root() -> bool:
    return os.geteuid() == 0
