"""Load tasks from KernelBench folders, single .py files, folders of .py files, JSONL and Parquet; write them.

Formats:
  - KernelBench layout: `ROOT/level1/19_ReLU.py`, `ROOT/level2/...` (one folder per level, files named
    `<problem id>_<Name>.py`). Task ids read `kb_l<level>_<problem id>_<name in snake case>`, e.g.
    `kb_l1_19_relu`; source "kernelbench"; level from the folder.
  - A single `.py` file, or a folder of them (searched recursively, `__init__.py` skipped): ids are the
    relative path in snake case; source "user".
  - JSONL (`.jsonl`): one JSON object per line. Canonical rows carry the `tasks.schema.Task` field names:
      id (str, required), name (str, required), reference (str, required: the module source), source,
      level (int), category (str), operators (list of str), shape_params ({name: int}), atol, rtol (float),
      metadata ({...}), dtype (str), provenance ({...}).
    Rows in the KernelBench dataset layout are also read: `code` (the source), `name`, `problem_id`, `level`;
    any other field of such a row goes into `metadata`.
  - Parquet (`.parquet`, needs pyarrow, in the `test` extra): the same columns as JSONL; the dict-valued
    fields (shape_params, metadata, provenance) may be JSON strings, which is how `write_parquet` stores them.

Loading is static: sources are parsed and checked for `Model`, `get_inputs` and `get_init_inputs`
(`tasks.validate.check_static`) but never executed; `tasks.analysis.analyze` runs them.

Errors: a `LoaderError` or `TaskValidationError` naming the file (and the line, for JSONL). Pass a list as
`errors` to collect them and keep loading the rest instead.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Iterable

from tasks.schema import Task
from tasks.validate import TaskValidationError, check_static

_KB_FILE = re.compile(r"^(\d+)_(.+)\.py$")
_KB_LEVEL = re.compile(r"^level(\d+)$")
_DICT_FIELDS = ("shape_params", "metadata", "provenance")


class LoaderError(ValueError):
    """A task file or dataset row that cannot be read; the message names the file (and line)."""


def slug(text: str) -> str:
    """Lower-case snake-case identifier: `Conv2d_ReLU BiasAdd` -> `conv2d_relu_biasadd`."""
    s = re.sub(r"[^0-9a-zA-Z]+", "_", text).strip("_").lower()
    return s or "task"


def _collect(errors: list | None, exc: Exception) -> None:
    if errors is None:
        raise exc
    errors.append(exc)


def task_from_source(
    source: str, *, task_id: str, name: str, origin: str, kind: str = "user", level: int = 0,
    provenance: dict[str, Any] | None = None,
) -> Task:
    """A Task from a reference source after static checks; shape_params from its int constants.

    Raises TaskValidationError naming `origin`.
    """
    info = check_static(source, origin)
    prov = {"path": origin}
    prov.update(provenance or {})
    return Task(id=task_id, name=name, reference=source, source=kind, level=level,  # type: ignore[arg-type]
                shape_params=dict(info.shape_params), provenance=prov)


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise LoaderError(f"{path}: cannot read: {e}") from None


def is_kernelbench_root(path: Path) -> bool:
    """A folder with at least one `levelN` subfolder."""
    return path.is_dir() and any(p.is_dir() and _KB_LEVEL.match(p.name) for p in path.iterdir())


def load_kernelbench(root: str | Path, levels: Iterable[int] | None = None, errors: list | None = None) -> list[Task]:
    """Tasks from a KernelBench-layout folder, ordered by level then problem id.

    Raises LoaderError when `root` has no levelN folders or a file name does not read `<id>_<Name>.py`.
    """
    root = Path(root)
    if not is_kernelbench_root(root):
        raise LoaderError(f"{root}: not a KernelBench folder (expected level1/, level2/, ... inside)")
    wanted = set(levels) if levels is not None else None
    out: list[Task] = []
    level_dirs = sorted((int(_KB_LEVEL.match(p.name).group(1)), p) for p in root.iterdir()  # type: ignore[union-attr]
                        if p.is_dir() and _KB_LEVEL.match(p.name))
    for level, folder in level_dirs:
        if wanted is not None and level not in wanted:
            continue
        files = []
        for f in folder.glob("*.py"):
            m = _KB_FILE.match(f.name)
            if not m:
                _collect(errors, LoaderError(f"{f}: KernelBench file names read <id>_<Name>.py"))
                continue
            files.append((int(m.group(1)), m.group(2), f))
        for pid, pname, f in sorted(files):
            try:
                out.append(task_from_source(
                    _read_text(f), task_id=f"kb_l{level}_{pid}_{slug(pname)}", name=f"{pid}_{pname}",
                    origin=str(f), kind="kernelbench", level=level,
                    provenance={"kernelbench_level": level, "kernelbench_problem_id": pid},
                ))
            except (LoaderError, TaskValidationError) as e:
                _collect(errors, e)
    return out


def load_py_file(path: str | Path, task_id: str | None = None) -> Task:
    """One task from one .py file (id: the file stem in snake case). Raises LoaderError / TaskValidationError."""
    path = Path(path)
    if path.suffix != ".py":
        raise LoaderError(f"{path}: expected a .py file")
    return task_from_source(_read_text(path), task_id=task_id or slug(path.stem), name=path.stem,
                            origin=str(path))


def load_py_folder(folder: str | Path, errors: list | None = None) -> list[Task]:
    """Tasks from every .py file under `folder` (recursive, sorted), ids from the relative path."""
    folder = Path(folder)
    if not folder.is_dir():
        raise LoaderError(f"{folder}: not a folder")
    out = []
    for f in sorted(folder.rglob("*.py")):
        if f.name == "__init__.py" or "__pycache__" in f.parts:
            continue
        rel = f.relative_to(folder).with_suffix("")
        try:
            out.append(load_py_file(f, task_id=slug("_".join(rel.parts))))
        except (LoaderError, TaskValidationError) as e:
            _collect(errors, e)
    return out


def _row_to_task(row: dict[str, Any], where: str) -> Task:
    if not isinstance(row, dict):
        raise LoaderError(f"{where}: expected a JSON object, got {type(row).__name__}")
    row = dict(row)
    for k in _DICT_FIELDS:
        if isinstance(row.get(k), str):
            try:
                row[k] = json.loads(row[k])
            except json.JSONDecodeError as e:
                raise LoaderError(f"{where}: field {k!r} is a string but not JSON: {e}") from None
        if row.get(k) is None and k in row:
            del row[k]
    if "reference" not in row and "code" in row:  # KernelBench dataset layout
        code = row.pop("code")
        name = str(row.pop("name", "") or "task")
        pid = row.pop("problem_id", None)
        level = int(row.pop("level", 0) or 0)
        meta = {k: v for k, v in row.items() if k not in ("id",)}
        task_id = row.get("id") or (f"kb_l{level}_{pid}_{slug(name)}" if pid is not None else slug(name))
        base = f"{pid}_{name}" if pid is not None and not name.startswith(f"{pid}_") else name
        row = {"id": str(task_id), "name": base, "reference": code, "source": "kernelbench", "level": level,
               "metadata": meta}
    try:
        task = Task.from_dict(row)
    except (ValueError, TypeError) as e:
        raise LoaderError(f"{where}: {e}") from None
    origin = f"{where} (task {task.id})"
    info = check_static(task.reference, origin)
    if not task.shape_params:
        task = task.replace(shape_params=dict(info.shape_params))
    if "path" not in task.provenance:
        task = task.replace(provenance={**task.provenance, "path": origin})
    return task


def load_jsonl(path: str | Path, errors: list | None = None) -> list[Task]:
    """Tasks from a JSONL file (field names in the module docstring). Blank lines are skipped."""
    path = Path(path)
    out = []
    text = _read_text(path)
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise LoaderError(f"{where}: not JSON: {e}") from None
            out.append(_row_to_task(row, where))
        except (LoaderError, TaskValidationError) as e:
            _collect(errors, e)
    return out


def _pyarrow():
    try:
        import pyarrow  # noqa: F401
        import pyarrow.parquet as pq
    except ImportError:
        raise LoaderError("reading or writing Parquet needs pyarrow: pip install 'cuda-agent[test]' or pyarrow") from None
    return pq


def load_parquet(path: str | Path, errors: list | None = None) -> list[Task]:
    """Tasks from a Parquet file with the JSONL columns. Raises LoaderError when pyarrow is missing."""
    pq = _pyarrow()
    path = Path(path)
    try:
        rows = pq.read_table(path).to_pylist()
    except Exception as e:
        raise LoaderError(f"{path}: cannot read Parquet: {e}") from None
    out = []
    for i, row in enumerate(rows):
        try:
            out.append(_row_to_task(row, f"{path}[row {i}]"))
        except (LoaderError, TaskValidationError) as e:
            _collect(errors, e)
    return out


def load_tasks(path: str | Path, errors: list | None = None) -> list[Task]:
    """Load from any supported path: .jsonl, .parquet, .py, a KernelBench root or a folder of .py files.

    Raises LoaderError for a missing path or an unknown file type.
    """
    path = Path(path)
    if not path.exists():
        raise LoaderError(f"{path}: no such file or folder")
    if path.is_dir():
        return load_kernelbench(path, errors=errors) if is_kernelbench_root(path) else load_py_folder(path, errors)
    if path.suffix == ".jsonl":
        return load_jsonl(path, errors)
    if path.suffix == ".parquet":
        return load_parquet(path, errors)
    if path.suffix == ".py":
        try:
            return [load_py_file(path)]
        except (LoaderError, TaskValidationError) as e:
            _collect(errors, e)
            return []
    raise LoaderError(f"{path}: unknown task file type (expected .jsonl, .parquet, .py or a folder)")


def task_to_json(task: Task) -> str:
    """One JSONL line (no newline) for a task."""
    return json.dumps(task.to_dict(), sort_keys=False)


def write_jsonl(tasks: Iterable[Task], path: str | Path, append: bool = False) -> int:
    """Write tasks as JSONL; returns how many. The parent folder is created."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with path.open("a" if append else "w", encoding="utf-8") as f:
        for t in tasks:
            f.write(task_to_json(t) + "\n")
            n += 1
    return n


def write_parquet(tasks: Iterable[Task], path: str | Path) -> int:
    """Write tasks as Parquet (dict fields as JSON strings); returns how many."""
    pq = _pyarrow()
    import pyarrow as pa

    rows = []
    for t in tasks:
        d = t.to_dict()
        for k in _DICT_FIELDS:
            d[k] = json.dumps(d[k])
        rows.append(d)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return len(rows)
