"""Synthesis + filtering throughput: accepted tasks per minute, acceptance rate, rejection reasons.

Usage: python benchmarks/tasks_bench.py [--n 40] [--workers 2] [--device cpu] [--seed 77] [--no-compile]
       python benchmarks/tasks_bench.py --demos 12      (speed of the naive vs fused cpu demonstrations)

Runs one fresh synthesis (graph composer -> FilterPool with the full filter: eager, determinism, degeneracy,
liveness, time window with autosize, torch.compile -> near-duplicate check) into a temporary folder and prints
a short table. Worker start-up (spawn, torch import, first torch.compile) is inside the measured wall time.
It also projects the time of a 6,000-task run on a host with more workers from the measured per-candidate
worker time (the filter is embarrassingly parallel: one candidate per worker process).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from tasks.filtering import FilterConfig  # noqa: E402
from tasks.synthesize import SynthesisConfig, Synthesizer, state_path  # noqa: E402


def demo_speeds(n_tasks: int, console: Console) -> None:
    """Profile the cpu demonstrations of `n_tasks` demo tasks (one per family first) through the sandbox:
    eager and candidate median ms per call, interleaved, one thread (the sandbox's default)."""
    from sandbox.config import SandboxConfig
    from sandbox.evaluator import Evaluator
    from tasks import builtin
    from tasks.demos import Demo

    demos = [Demo.from_dict(json.loads(line)) for line in (builtin.HERE / "demos.jsonl").read_text().splitlines()]
    tasks = {t.id: t for s in builtin.SPLITS for t in builtin.load_split(s)}
    order: list[str] = []
    for fam in ("pointwise", "row", "scan", "gemm", "conv2d", "pool2d"):
        order += sorted({d.task_id for d in demos if d.family == fam})
    picked: list[str] = []
    fams: dict[str, int] = {}
    for tid in order:  # round-robin over families
        fam = next(d.family for d in demos if d.task_id == tid)
        if fams.get(fam, 0) < max(1, n_tasks // 4) and len(picked) < n_tasks:
            picked.append(tid)
            fams[fam] = fams.get(fam, 0) + 1
    t = Table(title="cpu demonstrations through the sandbox (1 thread, median ms per call)")
    for col in ("task", "family", "eager ms", "naive ms", "fused ms", "naive/fused"):
        t.add_column(col, justify="right" if "ms" in col or "/" in col else "left")
    cfg = SandboxConfig(backend="cpu", use_compile=False, reps=10, num_trials=1)
    with Evaluator(cfg) as ev:
        for tid in picked:
            task = builtin.at_cpu_size(tasks[tid])
            row = {}
            for d in (d for d in demos if d.task_id == tid and d.format == "cpu"):
                r = ev.evaluate(task, d.files, "cpu")
                if r.status == "ok" and r.timing is not None:
                    row[d.variant] = r.timing.candidate.median_ms
                    row["eager"] = r.timing.eager.median_ms
                    row["family"] = d.family
                else:
                    row[d.variant] = float("nan")
            fast = row.get("fused", row.get("fast", float("nan")))
            t.add_row(tid, row.get("family", "?"), f"{row.get('eager', float('nan')):.3f}",
                      f"{row.get('naive', float('nan')):.3f}", f"{fast:.3f}", f"{row.get('naive', float('nan')) / fast:.1f}x")
    console.print(t)


class _BudgetSpent(Exception):
    """--budget-s ran out (raised from the progress callback, which ends the synthesis)."""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--demos", type=int, default=0, help="profile the cpu demos of this many tasks instead")
    ap.add_argument("--n", type=int, default=40, help="accepted tasks to synthesize")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--seed", type=int, default=77)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--project-workers", type=int, default=16, help="workers of the projected host")
    ap.add_argument("--budget-s", type=float, default=0.0,
                    help="stop the synthesis after this many seconds and report what finished (0: no limit)")
    args = ap.parse_args()
    console = Console()
    if args.demos:
        demo_speeds(args.demos, console)
        return
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "bench.jsonl"
        cfg = SynthesisConfig(n=args.n, out=str(out), seed=args.seed,
                              filter=FilterConfig(device=args.device, workers=args.workers, autosize=True,
                                                  check_compile=not args.no_compile))
        t0 = time.monotonic()
        last: list = []
        done_at: list[tuple[float, int]] = []  # (seconds since start, accepted so far) at each acceptance

        def progress(r) -> None:  # one line per filtered candidate; the budget ends the run from here
            last[:] = [r]
            if not done_at or r.accepted > done_at[-1][1]:  # acceptances only (a compose error is no filter result)
                done_at.append((time.monotonic() - t0, r.accepted))
            console.print(f"[{time.monotonic() - t0:6.1f} s] candidates {r.candidates}, accepted {r.accepted}",
                          highlight=False)
            if args.budget_s and time.monotonic() - t0 > args.budget_s:
                raise _BudgetSpent

        try:
            rep = Synthesizer(cfg).run(on_progress=progress)
        except _BudgetSpent:
            rep = last[0]
            console.print(f"budget of {args.budget_s:.0f} s spent: figures over the candidates that finished")
        wall = time.monotonic() - t0
        rows = [json.loads(line) for line in state_path(out).read_text().splitlines()]
    check_s = [r["check_s"] for r in rows if r["reason"] != "compose_error"]
    mean_check = statistics.mean(check_s) if check_s else float("nan")
    lock_s = [r.get("lock_wait_s", 0.0) for r in rows if r["reason"] not in ("compose_error", "timeout", "worker_crash")]
    rate = rep.accepted / rep.candidates if rep.candidates else 0.0
    # 6,000 accepted tasks need 6000 / rate candidates, each costing mean_check worker-seconds.
    proj_h = (6000 / rate) * mean_check / args.project_workers / 3600 if rate else float("inf")
    # the steady rate: accepted tasks between the first and the last acceptance (worker start-up and the first
    # torch.compile are not in it), from the progress callbacks' times
    steady = "-"
    if len(done_at) >= 2 and done_at[-1][0] > done_at[0][0]:
        steady = f"{60 * (done_at[-1][1] - done_at[0][1]) / (done_at[-1][0] - done_at[0][0]):.1f}"
    eager = sorted(r["eager_ms"] for r in rows if r["accepted"] and r.get("eager_ms") is not None)
    eager_mix = (f"{eager[0]:.2f} / {statistics.median(eager):.2f} / {eager[-1]:.2f} (window {cfg.filter.window[0]:g}"
                 f"-{cfg.filter.window[1]:g})" if eager else "-")
    t = Table(title=f"tasks synthesis + filtering ({args.device}, {args.workers} workers, {os.cpu_count()} cores)")
    t.add_column("metric")
    t.add_column("value", justify="right")
    for k, v in [
        ("accepted / candidates", f"{rep.accepted} / {rep.candidates}"),
        ("acceptance rate", f"{rate:.0%}"),
        ("wall time (incl. worker start-up)", f"{wall:.0f} s"),
        ("accepted tasks per minute", f"{60 * rep.accepted / wall:.1f}"),
        ("candidates per minute", f"{60 * rep.candidates / wall:.1f}"),
        ("worker time per candidate: mean / median", f"{mean_check:.2f} s / {statistics.median(check_s):.2f} s"),
        ("of it waiting for the GPU's timing lock: mean", f"{statistics.mean(lock_s):.2f} s" if lock_s else "-"),
        ("candidates with a contended timing", str(sum(1 for r in rows if r.get("contended")))),
        (f"projected 6,000 accepted with {args.project_workers} workers", f"{proj_h:.1f} h"),
        ("accepted per minute after the first acceptance (no start-up)", steady),
        ("eager ms of the accepted: min / median / max", eager_mix),
    ]:
        t.add_row(k, v)
    console.print(t)
    r = Table(title="rejection reasons")
    r.add_column("reason")
    r.add_column("count", justify="right")
    for k, v in sorted(rep.reasons.items(), key=lambda kv: -kv[1]):
        r.add_row(k, str(v))
    console.print(r)
    # what the filter's own failures and the forward errors were (the first line of up to 3 distinct details each):
    # a rejection count alone does not say whether the task or the machine failed
    for reason in ("internal_error", "out_of_memory", "forward_error", "timeout"):
        seen: list[str] = []
        for row in rows:
            first = (row.get("detail") or "").strip().splitlines()[:1]
            if row.get("reason") == reason and first and first[0] not in seen:
                seen.append(first[0])
        for line in seen[:3]:
            console.print(f"{reason} example: {line[:200]}", highlight=False, markup=False)


if __name__ == "__main__":
    main()
