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
    as_json: bool = typer.Option(False, "--json", help="One JSON object per line (id, name, source, level, "
                                 "category, operators, shape_params) instead of a table."),
) -> None:
    """List tasks (id, name, source, level, category, operators, shape parameters)."""
    import json

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
    if as_json:
        for t in tasks:
            typer.echo(json.dumps({"id": t.id, "name": t.name, "source": t.source, "level": t.level,
                                   "category": t.category, "operators": list(t.operators),
                                   "shape_params": dict(t.shape_params)}))
        return
    table = Table(title=f"{len(tasks)} task(s)")
    table.add_column("id", no_wrap=True)
    for col in ("name", "source", "level", "category", "operators", "shape params"):
        table.add_column(col, overflow="fold")
    for t in tasks:
        table.add_row(t.id, t.name, t.source, str(t.level), t.category or "-", " > ".join(t.operators) or "-",
                      ", ".join(f"{k}={v}" for k, v in t.shape_params.items()) or "-")
    out = console if console.is_terminal else Console(width=200)  # piped: room for every column
    out.print(table)


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


def _reason_table(reasons: dict[str, int], total: int, title: str) -> Table:
    from tasks.filtering import REASONS

    t = Table(title=title)
    t.add_column("rejection reason")
    t.add_column("count", justify="right")
    t.add_column("share of candidates", justify="right")
    t.add_column("meaning")
    for r, k in sorted(reasons.items(), key=lambda kv: -kv[1]):
        t.add_row(r, str(k), f"{k / total:.0%}" if total else "-", REASONS.get(r, ""))
    return t


def _filter_config(device: str, workers: int, threads: int, window: Optional[str], no_compile: bool,
                   no_timing: bool, timeout_s: float, autosize: bool):
    from tasks.filtering import FilterConfig

    win = [float(x) for x in window.split(",")] if window else []
    try:
        return FilterConfig(device=device, eager_window_ms=win, cpu_threads=threads, workers=workers,
                            check_compile=not no_compile, check_timing=not no_timing, task_timeout_s=timeout_s,
                            autosize=autosize)
    except ValueError as e:
        _fail(str(e))


@app.command("synthesize")
def synthesize(
    n: int = typer.Option(..., "--n", help="Number of accepted tasks wanted."),
    out: Path = typer.Option(..., "--out", help="Output JSONL (resumes when it and OUT.state.jsonl exist)."),
    seed: int = typer.Option(0, help="Composer seed."),
    workers: int = typer.Option(2, help="Filter worker processes."),
    device: str = typer.Option("cpu", help="Backend the tasks are for: cpu or cuda."),
    threads: int = typer.Option(1, help="torch threads per worker (timings are taken at this count)."),
    window: Optional[str] = typer.Option(None, help="Eager time window 'LOW,HIGH' in ms (default: 0.1,20 on cpu; 1,100 on cuda)."),
    benchmark: Optional[Path] = typer.Option(None, help="Benchmark folder/file to keep near-duplicates of out (contamination)."),
    max_candidates: int = typer.Option(0, help="Stop after this many candidates (default 30 x N)."),
    max_category_fraction: float = typer.Option(0.30, help="No category above this share of N."),
    no_compile: bool = typer.Option(False, "--no-compile", help="Skip the torch.compile check."),
    timeout_s: float = typer.Option(120.0, help="Per-candidate limit, seconds."),
    llm_base_url: Optional[str] = typer.Option(None, help="Compose with a language model at this OpenAI-compatible endpoint (e.g. http://host:8000/v1) instead of the graph composer."),
    llm_model: str = typer.Option("", help="Model name for --llm-base-url."),
    llm_api_key_env: str = typer.Option("OPENAI_API_KEY", help="Environment variable holding the endpoint's API key (may be unset)."),
) -> None:
    """Compose, filter (in parallel) and deduplicate tasks until N are accepted; resumable."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from tasks.diversity import diversity_report
    from tasks.loaders import load_jsonl
    from tasks.synthesize import SynthesisConfig, Synthesizer

    fcfg = _filter_config(device, workers, threads, window, no_compile, False, timeout_s, autosize=True)
    try:
        cfg = SynthesisConfig(n=n, out=str(out), seed=seed, benchmark=str(benchmark or ""),
                              max_candidates=max_candidates, max_category_fraction=max_category_fraction,
                              filter=fcfg)
    except ValueError as e:
        _fail(str(e))
    with Progress(TextColumn("[bold]synthesize"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[info]}"), TimeElapsedColumn(), console=console) as progress:
        bar = progress.add_task("accepted", total=n, info="starting workers...")

        def update(rep) -> None:
            rate = rep.run_accepted / rep.run_candidates if rep.run_candidates else 0
            progress.update(bar, completed=rep.accepted,
                            info=f"candidates {rep.candidates}, accept rate {rate:.0%}, {rep.accepted_per_min:.1f}/min")

        composer = None
        if llm_base_url:
            import os

            from tasks.llm_compose import LLMComposer, LLMComposerConfig

            try:
                composer = LLMComposer(LLMComposerConfig(base_url=llm_base_url, model=llm_model,
                                                         api_key=os.environ.get(llm_api_key_env, "")), cfg.compose)
            except ValueError as e:
                _fail(str(e))
        rep = Synthesizer(cfg, composer).run(on_progress=update)
    if rep.resumed_from:
        console.print(f"resumed after {rep.resumed_from} earlier candidate(s)")
    console.print(f"accepted {rep.accepted}/{n} tasks from {rep.candidates} candidates; this run: "
                  f"{rep.run_accepted} accepted of {rep.run_candidates} in {rep.elapsed_s:.0f} s "
                  f"({rep.accepted_per_min:.1f} accepted/min)")
    console.print(_reason_table(rep.reasons, rep.candidates, "rejections (all runs on this file)"))
    console.print(diversity_report(load_jsonl(out) if out.exists() else []).table())
    if rep.accepted < n:
        raise typer.Exit(1)


@app.command("filter")
def filter_(
    src: Path = typer.Argument(..., help="Tasks to filter (any format `tasks import` reads)."),
    out: Path = typer.Option(..., "--out", help="JSONL of the accepted tasks."),
    workers: int = typer.Option(2, help="Filter worker processes."),
    device: str = typer.Option("cpu", help="cpu or cuda."),
    threads: int = typer.Option(1, help="torch threads per worker."),
    window: Optional[str] = typer.Option(None, help="Eager time window 'LOW,HIGH' in ms."),
    benchmark: Optional[Path] = typer.Option(None, help="Reject near-duplicates of this benchmark folder/file."),
    dedup: bool = typer.Option(True, help="Drop near-duplicates within the set (first one kept)."),
    autosize: bool = typer.Option(False, help="Re-size too-fast tasks (changes their shape parameters)."),
    no_compile: bool = typer.Option(False, "--no-compile", help="Skip the torch.compile check."),
    no_timing: bool = typer.Option(False, "--no-timing", help="Skip the eager time window."),
    timeout_s: float = typer.Option(120.0, help="Per-task limit, seconds."),
    rejected: Optional[Path] = typer.Option(None, help="Also write one JSON line per rejected task here."),
) -> None:
    """Run the execution filters (and near-duplicate checks) alone on a task file."""
    import json

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from tasks.dedup import DedupIndex, benchmark_index
    from tasks.filtering import FilterPool, accepted_task
    from tasks.loaders import LoaderError, load_tasks, write_jsonl

    errors: list = []
    try:
        tasks = load_tasks(src, errors=errors)
    except LoaderError as e:
        _fail(str(e))
    fcfg = _filter_config(device, workers, threads, window, no_compile, no_timing, timeout_s, autosize)
    bench = benchmark_index(benchmark) if benchmark else None
    index = DedupIndex()
    order = {t.id: i for i, t in enumerate(tasks)}
    kept: dict[str, object] = {}
    reasons: dict[str, int] = {}
    rows = []
    for e in errors:
        reasons["load_error"] = reasons.get("load_error", 0) + 1
        rows.append({"task_id": None, "reason": "load_error", "detail": str(e)})
    verdicts = []
    with Progress(TextColumn("[bold]filter"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console) as progress, FilterPool(fcfg) as pool:
        bar = progress.add_task("tasks", total=len(tasks))
        for task, v in pool.map(tasks):
            verdicts.append((task, v))
            progress.advance(bar)
    for task, v in sorted(verdicts, key=lambda tv: order[tv[0].id]):  # dedup in input order: first one kept
        if v.accepted:
            final = accepted_task(task, v, fcfg)
            m = index.find(v.signature, final.reference) if dedup else None
            mb = bench.find(v.signature, final.reference) if bench is not None and m is None else None
            if m is not None:
                v.accepted, v.reason, v.detail = False, "near_duplicate", f"{m.reason} match with {m.key}"
            elif mb is not None:
                v.accepted, v.reason, v.detail = False, "contaminated", f"{mb.reason} match with {mb.key}"
            else:
                index.add(final.id, v.signature, final.reference)
                kept[task.id] = final
                continue
        reasons[v.reason] = reasons.get(v.reason, 0) + 1
        rows.append({"task_id": task.id, "reason": v.reason, "detail": v.detail})
    write_jsonl(kept.values(), out)
    if rejected:
        rejected.write_text("".join(json.dumps(r) + "\n" for r in rows))
    total = len(tasks) + len(errors)
    console.print(f"kept {len(kept)} of {total} task(s) -> {out}")
    console.print(_reason_table(reasons, total, "rejections"))


@app.command("mine")
def mine_cmd(
    probe: bool = typer.Option(True, help="Run a one-operator probe of every registry entry."),
) -> None:
    """Enumerate torch operators and report how many the registry can drive, by category."""
    from tasks.mining import mine

    rep = mine(run_probes=probe)
    console.print(rep.summary())
    t = Table(title="drivable registry operators by category")
    t.add_column("category")
    t.add_column("operators", justify="right")
    for c, k in sorted(rep.by_category.items(), key=lambda kv: -kv[1]):
        t.add_row(c, str(k))
    console.print(t)
    for name, why in rep.failed.items():
        err_console.print(f"not drivable: {name}: {why}")


@app.command("report")
def report(
    src: Path = typer.Argument(..., help="A task file or folder."),
) -> None:
    """Category and depth mix of a task set, against the diversity goals."""
    from tasks.diversity import diversity_report
    from tasks.loaders import LoaderError, load_tasks

    try:
        tasks = load_tasks(src)
    except LoaderError as e:
        _fail(str(e))
    rep = diversity_report(tasks)
    console.print(rep.table())
    if not rep.ok:
        raise typer.Exit(1)
