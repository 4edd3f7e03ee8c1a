"""Reward stability: the same honest solution evaluated again and again, and how far its speed-up and reward move.

A milestone reward is only as good as its repeatability: the top level needs a lower bound 5% above 1, which is of
the order of timing noise. This bench evaluates built-in demonstrations (`tasks/builtin/demos.jsonl`, honest
solutions) `--evals` times each with one long-lived `Evaluator` (warm trusted worker, reference cache and build
cache, as in service) and reports per solution: the eager time per call, the speed-up over eager (min / median /
max and its coefficient of variation across evaluations), the rewards, the repetitions the profile ran, the
median shortfall the timing rules charged per repetition (from the profile log, sandbox.timing.charge_shortfall)
and the evaluation's wall time.

    python benchmarks/stability_bench.py --format cubin --tasks gpu_tr_061,gpu_tr_014 --evals 5 [--variants fused]
        [--config '{"reps": 20}'] [--json raw.json]
    python benchmarks/stability_bench.py --format cpu --tasks op_relu,op_softmax --evals 3      # the CPU backend

On the CPU backend GPU-sized tasks run at the sizes they were filtered at on a CPU (`builtin.at_cpu_size`).
Prints a table last; record the figures in benchmarks/RESULTS.md (date, machine, command).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sandbox.config import SandboxConfig  # noqa: E402
from sandbox.evaluator import Evaluator  # noqa: E402
from tasks import builtin  # noqa: E402
from tasks.demos import Demo  # noqa: E402

SHORTFALL = re.compile(r"median shortfall ([0-9.]+) ms")


def load_demos(fmt: str, task_ids: list[str], variants: list[str]) -> list[Demo]:
    """The demos of format fmt for task_ids (all tasks with such demos when empty), of the given variants (all
    when empty). Raises SystemExit naming a task id with no demo of that format."""
    demos = [Demo.from_dict(json.loads(line)) for line in (builtin.HERE / "demos.jsonl").read_text().splitlines()]
    demos = [d for d in demos if d.format == fmt and (not variants or d.variant in variants)]
    if task_ids:
        missing = sorted(set(task_ids) - {d.task_id for d in demos})
        if missing:
            raise SystemExit(f"no {fmt} demo{' of variant ' + ','.join(variants) if variants else ''} for: "
                             f"{', '.join(missing)}")
        demos = [d for d in demos if d.task_id in task_ids]
    return demos


def one_eval(ev: Evaluator, task, d: Demo, fmt: str) -> dict:
    t0 = time.perf_counter()
    r = ev.evaluate(task, d.files, fmt)
    wall_s = time.perf_counter() - t0
    t = r.timing
    short = [float(m.group(1)) for line in r.log for m in [SHORTFALL.search(line)] if m]
    return {"status": r.status, "reward": r.reward, "wall_s": wall_s, "stage_ms": r.stage_ms,
            "message": r.message[:300], "speedup": t.speedup_eager.point if t else None,
            "speedup_lo": t.speedup_eager.lo if t else None, "eager_ms": t.eager.median_ms if t else None,
            "candidate_ms": t.candidate.median_ms if t else None, "reps": t.candidate.reps if t else 0,
            "calls": t.calls_per_rep if t else 0, "shortfall_ms": short[0] if short else 0.0, "log": r.log}


def summarise(rows: list[dict]) -> dict:
    """Figures across the evaluations of one solution (speed-ups of the `ok` ones only)."""
    sp = [r["speedup"] for r in rows if r["status"] == "ok" and r["speedup"] is not None]
    med = statistics.median
    return {"statuses": sorted({r["status"] for r in rows}), "rewards": [r["reward"] for r in rows],
            "speedup_min": min(sp) if sp else None, "speedup_median": med(sp) if sp else None,
            "speedup_max": max(sp) if sp else None,
            "speedup_cv": statistics.pstdev(sp) / statistics.mean(sp) if len(sp) > 1 else None,
            "eager_ms": med([r["eager_ms"] for r in rows if r["eager_ms"] is not None] or [0.0]),
            "reps": [r["reps"] for r in rows], "shortfall_ms": med([r["shortfall_ms"] for r in rows]),
            "wall_s": med([r["wall_s"] for r in rows])}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--format", default="cpu", choices=("cpu", "cubin"), help="solution format (cubin: CUDA backend)")
    ap.add_argument("--tasks", default="", help="comma-separated task ids (default: every task with such demos)")
    ap.add_argument("--variants", default="", help="comma-separated demo variants (default: all)")
    ap.add_argument("--evals", type=int, default=3, help="evaluations per solution, after one warm-up")
    ap.add_argument("--config", default="{}", help="JSON of SandboxConfig fields")
    ap.add_argument("--json", default="", help="also write every evaluation's figures here")
    a = ap.parse_args(argv)
    if a.evals < 2:
        ap.error("--evals must be >= 2 (a spread needs two evaluations)")
    try:
        extra = json.loads(a.config)
    except json.JSONDecodeError as e:
        ap.error(f"--config is not JSON: {e}")
    cuda = a.format == "cubin"
    demos = load_demos(a.format, [t for t in a.tasks.split(",") if t], [v for v in a.variants.split(",") if v])
    by_id = {t.id: t for name in builtin.SPLITS for t in builtin.load_split(name)}
    root = Path(tempfile.mkdtemp(prefix="stability-"))
    cfg = SandboxConfig(**{"backend": "cuda" if cuda else "cpu", "use_compile": False,
                           "cache_dir": str(root / "cache"), "work_root": str(root / "ws"), **extra})
    console = Console(width=160)
    raw: dict[str, list[dict]] = {}
    summaries: dict[str, dict] = {}
    with Evaluator(cfg) as ev:
        for d in demos:
            task = by_id[d.task_id] if cuda else builtin.at_cpu_size(by_id[d.task_id])
            key = f"{d.task_id}/{d.variant}"
            warm = one_eval(ev, task, d, a.format)  # build, reference and baselines' first calls
            rows = [one_eval(ev, task, d, a.format) for _ in range(a.evals)]
            raw[key] = [dict(warm, warmup=True)] + rows
            s = summaries[key] = summarise(rows)
            lo, hi = (f"{x:.2f}" if x is not None else "-" for x in (s["speedup_min"], s["speedup_max"]))
            console.print(f"{key}: {s['statuses']} speed-up {lo}..{hi} rewards {s['rewards']} "
                          f"({s['wall_s']:.1f} s per evaluation)")
    if a.json:
        Path(a.json).write_text(json.dumps(raw, indent=1))
    table = Table(title=f"reward stability, {a.format}, {a.evals} evaluations per solution (after a warm-up)")
    for col in ("solution", "eager ms/call", "speed-up min / med / max", "CV", "rewards", "reps",
                "shortfall ms/rep", "eval s"):
        table.add_column(col, justify="right")
    f = lambda x, p=3: "-" if x is None else f"{x:.{p}f}"  # noqa: E731
    for key, s in summaries.items():
        table.add_row(key, f(s["eager_ms"]), f"{f(s['speedup_min'], 2)} / {f(s['speedup_median'], 2)} / "
                      f"{f(s['speedup_max'], 2)}", f(s["speedup_cv"], 2), " ".join(f"{x:g}" for x in s["rewards"]),
                      " ".join(str(x) for x in s["reps"]), f(s["shortfall_ms"], 2), f(s["wall_s"], 1))
    console.print(table)


if __name__ == "__main__":
    main()
