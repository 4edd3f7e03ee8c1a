"""The user's task library: one JSONL file that `cuda-agent tasks import` adds to.

Location: `$CUDA_AGENT_TASK_LIBRARY` if set, else `~/.cache/cuda-agent/tasks/library.jsonl`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

from tasks.loaders import load_jsonl, write_jsonl
from tasks.schema import Task


def library_path() -> Path:
    env = os.environ.get("CUDA_AGENT_TASK_LIBRARY")
    if env:
        return Path(env)
    return Path.home() / ".cache" / "cuda-agent" / "tasks" / "library.jsonl"


def read_library(path: str | Path | None = None) -> list[Task]:
    """Tasks in the library (empty when the file does not exist yet)."""
    p = Path(path) if path is not None else library_path()
    return load_jsonl(p) if p.exists() else []


def merge_into_library(tasks: Iterable[Task], path: str | Path | None = None) -> tuple[int, int]:
    """Add tasks by id (a task with an id already there replaces it). Returns (added, replaced)."""
    p = Path(path) if path is not None else library_path()
    current = {t.id: t for t in read_library(p)}
    added = replaced = 0
    for t in tasks:
        if t.id in current:
            replaced += 1
        else:
            added += 1
        current[t.id] = t
    tmp = p.with_suffix(p.suffix + ".tmp")
    write_jsonl(current.values(), tmp)
    os.replace(tmp, p)
    return added, replaced
