"""Synthesis + filtering throughput: accepted tasks per minute, acceptance rate, rejection reasons.

Usage: python benchmarks/tasks_bench.py [--n 40] [--workers 2] [--device cpu] [--seed 77] [--no-compile]

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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=40, help="accepted tasks to synthesize")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--seed", type=int, default=77)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--project-workers", type=int, default=16, help="workers of the projected host")
    args = ap.parse_args()
    console = Console()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "bench.jsonl"
        cfg = SynthesisConfig(n=args.n, out=str(out), seed=args.seed,
                              filter=FilterConfig(device=args.device, workers=args.workers, autosize=True,
                                                  check_compile=not args.no_compile))
        t0 = time.monotonic()
        rep = Synthesizer(cfg).run()
        wall = time.monotonic() - t0
        rows = [json.loads(line) for line in state_path(out).read_text().splitlines()]
    check_s = [r["check_s"] for r in rows if r["reason"] != "compose_error"]
    mean_check = statistics.mean(check_s) if check_s else float("nan")
    rate = rep.accepted / rep.candidates if rep.candidates else 0.0
    # 6,000 accepted tasks need 6000 / rate candidates, each costing mean_check worker-seconds.
    proj_h = (6000 / rate) * mean_check / args.project_workers / 3600 if rate else float("inf")
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
        (f"projected 6,000 accepted with {args.project_workers} workers", f"{proj_h:.1f} h"),
    ]:
        t.add_row(k, v)
    console.print(t)
    r = Table(title="rejection reasons")
    r.add_column("reason")
    r.add_column("count", justify="right")
    for k, v in sorted(rep.reasons.items(), key=lambda kv: -kv[1]):
        r.add_row(k, str(v))
    console.print(r)


if __name__ == "__main__":
    main()
