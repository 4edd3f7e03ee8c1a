"""Sandbox job messages (actor -> sandbox node): `SandboxJob` and `SandboxResult`.

Backpressure: a node at capacity answers a job with `protocol.handshake.Error(code="busy",
request_id=job_id, retry_after_s=...)`; the client tries another node (see `protocol.rpc`). Jobs are
idempotent by `job_id`, so a job may be resent to another node after a timeout.
"""

from __future__ import annotations

import dataclasses
import posixpath
from typing import Any, ClassVar

from protocol.errors import ProtocolError
from protocol.message import (Message, check_float, check_int, check_plain_map, check_text, set_field)

FORMATS = ("cubin", "extension", "cpu")
MAX_FILES = 256
MAX_FILE_CHARS = 4 << 20
MAX_PATH_CHARS = 255


def check_workspace_path(owner: str, name: str, path: Any) -> str:
    """A workspace-relative POSIX path: no absolute path, no "..", no empty or "." parts, no NUL or "\\"."""
    check_text(owner, name, path, max_len=MAX_PATH_CHARS)
    bad = (path.startswith("/") or "\0" in path or "\\" in path
           or any(part in ("", ".", "..") for part in path.split("/"))
           or posixpath.normpath(path) != path)
    if bad:
        raise ProtocolError(f"{owner}.{name}", f"{path[:80]!r} is not a plain workspace-relative path")
    return path


@dataclasses.dataclass(frozen=True, eq=False)
class SandboxJob(Message):
    """Build, verify and profile one candidate solution.

    Fields:
      job_id: unique, idempotency key (a resent job with the same id is the same job).
      task: the task record as a plain map (`tasks.schema.Task.to_dict()`).
      files: workspace-relative path -> file text (at most MAX_FILES files of MAX_FILE_CHARS characters).
      format: solution format, one of FORMATS ("cubin", "extension", "cpu").
      settings: plain map of evaluation settings (sandbox-owned keys: number of checks, warm-up, ...).
      priority: 0 for evaluation, higher for training (the node serves lower numbers first).
      deadline_s: the client gives up on the job after this many seconds (> 0).
    """

    TYPE: ClassVar[str] = "SandboxJob"
    job_id: str
    task: dict[str, Any]
    files: dict[str, str]
    format: str
    settings: dict[str, Any] = dataclasses.field(default_factory=dict)
    priority: int = 1
    deadline_s: float = 600.0

    def __post_init__(self) -> None:
        t = self.TYPE
        check_text(t, "job_id", self.job_id)
        set_field(self, "task", check_plain_map(t, "task", self.task))
        if not isinstance(self.files, dict):
            raise ProtocolError(f"{t}.files", f"expected a map of path -> text, got {type(self.files).__name__}")
        if len(self.files) > MAX_FILES:
            raise ProtocolError(f"{t}.files", f"{len(self.files)} files, limit {MAX_FILES}")
        for path, text in self.files.items():
            check_workspace_path(t, "files", path)
            check_text(t, f"files[{path}]", text, max_len=MAX_FILE_CHARS, empty=True)
        check_text(t, "format", self.format, choices=FORMATS)
        set_field(self, "settings", check_plain_map(t, "settings", self.settings))
        set_field(self, "priority", check_int(t, "priority", self.priority, lo=0, hi=2**31))
        deadline = check_float(t, "deadline_s", self.deadline_s, lo=0.0)
        if deadline <= 0:
            raise ProtocolError(f"{t}.deadline_s", "must be > 0")
        set_field(self, "deadline_s", deadline)


@dataclasses.dataclass(frozen=True, eq=False)
class SandboxResult(Message):
    """The outcome of a job. Fields: job_id, status (sandbox-owned word, e.g. "ok", "compile_error"),
    result (the sandbox's `EvalResult.to_dict()`, a plain map the sandbox owns), node_id (who ran it)."""

    TYPE: ClassVar[str] = "SandboxResult"
    job_id: str
    status: str
    result: dict[str, Any]
    node_id: str

    def __post_init__(self) -> None:
        t = self.TYPE
        check_text(t, "job_id", self.job_id)
        check_text(t, "status", self.status, max_len=64)
        set_field(self, "result", check_plain_map(t, "result", self.result))
        check_text(t, "node_id", self.node_id)
