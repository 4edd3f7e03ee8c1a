"""`cuda-agent tasks ...`: import, list and show tasks; synthesize and filter task sets.

Thin wrappers over the library code in this package; torch is imported only inside commands that run tasks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(help="Tasks: import, list, show, synthesize, filter.", no_args_is_help=True,
                  add_completion=False, pretty_exceptions_enable=False)
console = Console()
err_console = Console(stderr=True, soft_wrap=True)


def _tasks_from(path: Optional[Path]):
    """Tasks of a given file/folder, or the user's library plus the built-in splits."""
    from tasks.loaders import load_tasks

    if path is not None:
        return load_tasks(path)
    from tasks.library import read_library

    out = list(read_library())
    try:
        from tasks import builtin
    except ImportError:
        return out
    seen = {t.id for t in out}
    for t in builtin.load_all():
        if t.id not in seen:
            out.append(t)
            seen.add(t.id)
    return out


def _fail(msg: str, code: int = 2) -> None:
    err_console.print(f"[red]error:[/red] {msg}")
    raise typer.Exit(code)


@app.command("import")
def import_(
    path: Path = typer.Argument(..., help="A KernelBench folder, a .py file, a folder of .py files, .jsonl or .parquet."),
    library: Optional[Path] = typer.Option(None, help="Library JSONL to add to (default: $CUDA_AGENT_TASK_LIBRARY or ~/.cache/cuda-agent/tasks/library.jsonl)."),
    check: bool = typer.Option(True, help="Run each reference (build, forward twice, determinism) before importing."),
    keep_going: bool = typer.Option(False, help="Import the valid tasks even when some fail."),
) -> None:
    """Validate tasks from PATH and add them to the task library."""
    from tasks.analysis import analyze
    from tasks.library import library_path, merge_into_library
    from tasks.loaders import LoaderError, load_tasks
    from tasks.validate import TaskValidationError

    errors: list = []
    try:
        loaded = load_tasks(path, errors=errors)
    except LoaderError as e:
        _fail(str(e))
    good = []
    for t in loaded:
        try:
            good.append(analyze(t, runtime=check))
        except TaskValidationError as e:
            errors.append(e)
    for e in errors:
        err_console.print(f"[red]invalid:[/red] {e}", highlight=False)
    if errors and not keep_going:
        _fail(f"{len(errors)} task(s) failed validation; nothing imported (use --keep-going to import the rest)", 1)
    if not good:
        _fail(f"no valid task found in {path}", 1)
    added, replaced = merge_into_library(good, library)
    where = library or library_path()
    console.print(f"imported {len(good)} task(s) into {where} ({added} new, {replaced} replaced, {len(errors)} invalid)")


@app.command("list")
def list_(
    filter: Optional[str] = typer.Option(None, "--filter", "-f", help="Keep tasks whose id, name, category or operators contain this text."),
    source: Optional[Path] = typer.Option(None, "--from", help="List this file/folder instead of the library and built-in set."),
    category: Optional[str] = typer.Option(None, help="Only this category."),
) -> None:
    """List tasks (id, name, source, level, category, operators, shape parameters)."""
    from tasks.loaders import LoaderError

    try:
        tasks = _tasks_from(source)
    except LoaderError as e:
        _fail(str(e))
    if filter:
        f = filter.lower()
        tasks = [t for t in tasks if f in t.id.lower() or f in t.name.lower() or f in t.category.lower()
                 or any(f in op.lower() for op in t.operators)]
    if category:
        tasks = [t for t in tasks if t.category == category]
    table = Table(title=f"{len(tasks)} task(s)")
    table.add_column("id", no_wrap=True)
    for col in ("name", "source", "level", "category", "operators", "shape params"):
        table.add_column(col, overflow="fold")
    for t in tasks:
        table.add_row(t.id, t.name, t.source, str(t.level), t.category or "-", " > ".join(t.operators) or "-",
                      ", ".join(f"{k}={v}" for k, v in t.shape_params.items()) or "-")
    console.print(table)


@app.command("show")
def show(
    task_id: str = typer.Argument(..., help="Task id (see `tasks list`)."),
    source: Optional[Path] = typer.Option(None, "--from", help="Look in this file/folder instead of the library and built-in set."),
) -> None:
    """Show one task: its record and its reference source."""
    from rich.syntax import Syntax

    from tasks.loaders import LoaderError

    try:
        tasks = {t.id: t for t in _tasks_from(source)}
    except LoaderError as e:
        _fail(str(e))
    if task_id not in tasks:
        close = [i for i in tasks if task_id.lower() in i.lower()][:10]
        _fail(f"no task with id {task_id!r}" + (f"; did you mean: {', '.join(close)}" if close else ""), 1)
    t = tasks[task_id]
    table = Table(show_header=False, title=t.id)
    table.add_column("field", style="bold")
    table.add_column("value", overflow="fold")
    for k in ("name", "source", "level", "category", "dtype", "atol", "rtol"):
        table.add_row(k, str(getattr(t, k)))
    table.add_row("operators", " > ".join(t.operators) or "-")
    table.add_row("shape_params", ", ".join(f"{k}={v}" for k, v in t.shape_params.items()) or "-")
    table.add_row("content_hash", t.content_hash[:16])
    for k, v in sorted(t.metadata.items()):
        table.add_row(f"metadata.{k}", str(v))
    for k, v in sorted(t.provenance.items()):
        table.add_row(f"provenance.{k}", str(v))
    console.print(table)
    console.print(Syntax(t.reference, "python", line_numbers=True))
