"""`cuda-agent sandbox ...`: evaluate solutions from the command line (thin wrapper over sandbox.evaluator).

    cuda-agent sandbox eval TASK SOLUTION [--backend cuda|cpu] [--format cubin|extension|cpu] [--json]

TASK: a task folder (model.py [+ task.json]), a reference .py file or a .json task record.
SOLUTION: a solution folder (model_new.py [+ kernels/]) or a single model_new.py-style file.
Folder mode: TASK a folder of tasks and SOLUTION a folder of solutions named by task id (folder or <id>.py);
every pair is evaluated and a table printed. Exit code 0 whenever candidates were evaluated (whatever their
reward), 2 for usage errors (missing files, a task whose reference is not a valid task - checked statically before
anything is built -, a format the backend cannot run, bad config).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

app = typer.Typer(name="sandbox", help="Build, verify, profile and reward candidate kernels.", no_args_is_help=True,
                  add_completion=False, pretty_exceptions_enable=False)


def _is_task(p: Path) -> bool:
    return (p.is_dir() and (p / "model.py").exists()) or (p.is_file() and p.suffix in (".py", ".json"))


def _pairs(task: Path, solution: Path) -> list[tuple[Path, Path]]:
    if _is_task(task):
        return [(task, solution)]
    if not task.is_dir() or not solution.is_dir():
        raise typer.BadParameter(f"{task}: not a task, and not a folder of tasks with a folder of solutions")
    out = []
    for t in sorted(task.iterdir()):
        if not _is_task(t):
            continue
        tid = t.stem if t.is_file() else t.name
        for cand in (solution / tid, solution / f"{tid}.py"):
            if cand.exists():
                out.append((t, cand))
                break
    if not out:
        raise typer.BadParameter(f"no solution in {solution} is named after a task in {task}")
    return out


def _fmt_speedup(s) -> str:  # noqa: ANN001
    return "-" if s is None else f"{s.point:.2f}x [{s.lo:.2f}, {s.hi:.2f}]"


def _print_one(res) -> None:  # noqa: ANN001
    from rich.console import Console

    c = Console()
    color = "green" if res.ok else "red"
    c.print(f"[bold]{res.task_id}[/bold] ({res.format} on {res.backend}): [{color}]{res.status}[/{color}]  "
            f"reward {res.reward:g}")
    if res.message:
        c.print(f"  {res.message}")
    if res.timing:
        t = res.timing
        comp = f"{t.compiled.median_ms:.4f} ms" if t.compiled else "n/a"
        c.print(f"  eager {t.eager.median_ms:.4f} ms | torch.compile {comp} | candidate {t.candidate.median_ms:.4f} ms "
                f"(median of {t.candidate.reps} reps x {t.calls_per_rep} calls, IQR {t.candidate.iqr_ms:.4f} ms)")
        c.print(f"  speed-up over eager {_fmt_speedup(t.speedup_eager)}, over torch.compile "
                f"{_fmt_speedup(t.speedup_compile)} ({t.speedup_eager.level:.0%} intervals)")
    c.print("  stages (ms): " + ", ".join(f"{k} {v:.0f}" for k, v in res.stage_ms.items()))
    if res.violations:
        for v in res.violations[:5]:
            c.print(f"  violation [{v.kind}] {v.detail}")
    if res.compile_log and not res.ok:
        c.print("  compile log:\n" + "\n".join("    " + ln for ln in res.compile_log.splitlines()[:20]))
    c.print(f"  isolation: {res.isolation.get('mode')} (uid {res.isolation.get('uid')})")


def _print_table(results) -> None:  # noqa: ANN001
    from rich.console import Console
    from rich.table import Table

    tb = Table(title="sandbox evaluation")
    for col in ("task", "format", "status", "reward", "vs eager", "vs compile", "candidate ms", "message"):
        tb.add_column(col)
    for r in results:
        t = r.timing
        tb.add_row(r.task_id, r.format, r.status, f"{r.reward:g}", _fmt_speedup(t.speedup_eager) if t else "-",
                   _fmt_speedup(t.speedup_compile) if t else "-", f"{t.candidate.median_ms:.4f}" if t else "-",
                   r.message[:60])
    Console().print(tb)


@app.command("eval")
def eval_cmd(
    task: Path = typer.Argument(..., help="task folder / .py / .json, or a folder of tasks"),
    solution: Path = typer.Argument(..., help="solution folder or file, or a folder of solutions named by task"),
    backend: str = typer.Option("auto", "--backend", help="cuda | cpu | auto"),
    fmt: Optional[str] = typer.Option(None, "--format", help="cubin | extension | cpu (default: guessed from files)"),
    as_json: bool = typer.Option(False, "--json", help="print the EvalResult(s) as JSON"),
    config: Optional[Path] = typer.Option(None, "--config", help="YAML preset for SandboxConfig"),
    overrides: list[str] = typer.Option([], "--set", help="SandboxConfig override key=value (repeatable)"),
    metrics_out: Optional[Path] = typer.Option(None, "--metrics-out", help="folder mode: also write the KernelBench "
                                               "metrics (metrics.json, metrics.md) into this folder"),
) -> None:
    """Evaluate SOLUTION on TASK and print status, reward, speed-ups and timings. Folder mode also prints the
    KernelBench metrics per level (cuda_agent.kb_metrics, the same function as `cuda-agent eval`)."""
    from cuda_agent.config import ConfigError, load_config
    from sandbox.config import SandboxConfig
    from sandbox.evaluator import Evaluator, check_format, resolve_backend
    from sandbox.files import guess_format, load_solution, load_task
    from tasks.validate import check_static

    if not task.exists():
        raise typer.BadParameter(f"{task} does not exist", param_hint="TASK")
    if not solution.exists():
        raise typer.BadParameter(f"{solution} does not exist", param_hint="SOLUTION")
    try:
        cfg = load_config(SandboxConfig, config, [*overrides, f"backend={backend}"])
    except (ConfigError, ValueError) as e:
        raise typer.BadParameter(str(e)) from None
    be = resolve_backend(cfg.backend)
    pairs = _pairs(task, solution)
    jobs = []
    for tp, sp in pairs:
        try:
            t = load_task(tp)
            check_static(t.reference, str(tp))  # no Model / get_inputs, a syntax error: the task is at fault
            files = load_solution(sp)
        except (OSError, ValueError) as e:
            raise typer.BadParameter(str(e)) from None
        f = fmt or guess_format(files, be)
        try:
            check_format(f, be)
        except ValueError as e:
            raise typer.BadParameter(str(e), param_hint="--format") from None
        jobs.append((t, files, f))
    results = []
    with Evaluator(cfg) as ev:
        for t, files, f in jobs:
            results.append(ev.evaluate(t, files, f))
    if as_json:
        payload = [r.to_dict() for r in results]
        sys.stdout.write(json.dumps(payload[0] if len(payload) == 1 and _is_task(task) else payload, indent=1,
                                    default=float) + "\n")
    elif len(results) == 1 and _is_task(task):
        _print_one(results[0])
    else:
        _print_table(results)
        from rich.console import Console

        from cuda_agent.kb_metrics import (environment, kernelbench_metrics, rich_table, sample_from_eval_result,
                                           write_report)

        metrics = kernelbench_metrics([sample_from_eval_result(r, t.level) for (t, _, _), r in zip(jobs, results)])
        env = environment()
        Console().print(rich_table(metrics, "KernelBench metrics", env))
        if metrics_out is not None:
            metrics_out.mkdir(parents=True, exist_ok=True)
            write_report(metrics, env, metrics_out / "metrics.json", metrics_out / "metrics.md",
                         {"solutions": str(solution), "tasks": str(task)})


# The node service and the fleet stress test live in sandbox/service_cli.py (issue 5).
from sandbox.service_cli import serve_cmd, stress_cmd  # noqa: E402

app.command("serve")(serve_cmd)
app.command("stress")(stress_cmd)
