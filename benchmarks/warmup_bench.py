"""Cold first repetitions: an honest corpus solution evaluated again and again at a scaled size, with the
candidate's first timed repetitions set against its median (issue 3, the profile's warm-up).

    python benchmarks/warmup_bench.py --format cpu --tasks elementwise_chain,row_softmax --factor 4 --evals 8 \
        [--config '{"reps": 20}'] [--json OUT.json]

One long-lived Evaluator (warm trusted worker, reference and build caches, as in service) evaluates each corpus
task's `<fmt>/fast` solution, its first shape parameter scaled by --factor (benchmarks/fleet_bench.scaled_task),
--evals times with the default SandboxConfig (plus --config). Per evaluation it prints: status, reward, speed-up
over eager (point and lower bound), repetitions run, calls per repetition, the candidate's median ms per call and
its first 3 repetitions' ms per call as multiples of that median (TimingStats.candidate.samples_ms), and the
evaluation's wall time (s) and profile stage (ms). A summary line per task gives the rewards and the median of
those figures. Record them in benchmarks/RESULTS.md (date, machine, load average, command).
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fleet_bench import corpus_task  # noqa: E402

from sandbox.config import SandboxConfig  # noqa: E402
from sandbox.evaluator import Evaluator  # noqa: E402
from sandbox.files import load_solution  # noqa: E402
from sandbox.stress import DEFAULT_CORPUS  # noqa: E402
from tasks.schema import Task  # noqa: E402


def one_eval(ev: Evaluator, task: Task, files: dict[str, str], fmt: str) -> dict:
    """One evaluation's figures: times in ms per call (candidate samples), wall_s in s, profile_ms in ms."""
    t0 = time.perf_counter()
    r = ev.evaluate(task, files, fmt)
    wall_s = time.perf_counter() - t0
    t = r.timing
    samples = t.candidate.samples_ms if t else []
    med = t.candidate.median_ms if t else None
    return {"status": r.status, "reward": r.reward, "wall_s": wall_s, "profile_ms": r.stage_ms.get("profile"),
            "speedup": t.speedup_eager.point if t else None, "speedup_lo": t.speedup_eager.lo if t else None,
            "reps": t.candidate.reps if t else 0, "calls": t.calls_per_rep if t else 0,
            "warmup_calls": t.warmup_calls if t else 0, "candidate_ms": med, "samples_ms": samples,
            "eager_ms": t.eager.median_ms if t else None,
            "first3_x_median": [s / med for s in samples[:3]] if med else [], "message": r.message[:200]}


def line(i: int | str, row: dict) -> str:
    f = lambda x, p=2: "-" if x is None else f"{x:.{p}f}"  # noqa: E731
    first = " ".join(f"{x:.2f}" for x in row["first3_x_median"])
    return (f"  eval {i}: {row['status']} reward {row['reward']} speed-up {f(row['speedup'])} "
            f"(lo {f(row['speedup_lo'])}) reps {row['reps']} calls {row['calls']} "
            f"cand {f(row['candidate_ms'], 3)} ms first3/median [{first}] "
            f"eval {row['wall_s']:.2f} s profile {f(row['profile_ms'], 0)} ms")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--format", default="cpu", choices=("cpu", "cubin"))
    ap.add_argument("--tasks", default="elementwise_chain", help="comma-separated corpus tasks with a fast solution")
    ap.add_argument("--factor", type=int, default=4, help="scale of each task's first shape parameter")
    ap.add_argument("--evals", type=int, default=8, help="evaluations per task, after one warm-up evaluation")
    ap.add_argument("--config", default="{}", help="JSON of SandboxConfig fields")
    ap.add_argument("--json", type=Path, default=None, help="also write every evaluation's figures here")
    a = ap.parse_args(argv)
    extra = json.loads(a.config)
    root = Path(tempfile.mkdtemp(prefix="warmup-bench-"))
    cfg = SandboxConfig(**{"backend": "cpu" if a.format == "cpu" else "cuda", "cache_dir": str(root / "cache"),
                           "work_root": str(root / "ws"), **extra})
    print(f"load average {os.getloadavg()[0]:.2f}; config {extra or 'default'}", flush=True)
    raw: dict[str, list[dict]] = {}
    with Evaluator(cfg) as ev:
        for name in [t for t in a.tasks.split(",") if t]:
            task = corpus_task(name, a.factor)
            files = load_solution(Path(DEFAULT_CORPUS) / name / a.format / "fast")
            print(f"{task.id}:", flush=True)
            warm = one_eval(ev, task, files, a.format)  # build, reference, torch.compile's first calls
            print(line("warm-up", warm), flush=True)
            rows = []
            for i in range(a.evals):
                rows.append(one_eval(ev, task, files, a.format))
                print(line(i, rows[-1]), flush=True)
            raw[task.id] = [dict(warm, warmup=True)] + rows
            med = statistics.median
            firsts = [x for r in rows for x in r["first3_x_median"][:2]]
            print(f"  {task.id}: rewards {[r['reward'] for r in rows]}, speed-up median "
                  f"{med([r['speedup'] or 0.0 for r in rows]):.2f}, first two reps / median: median "
                  f"{med(firsts) if firsts else float('nan'):.2f} max {max(firsts, default=float('nan')):.2f}, "
                  f"eval s median {med([r['wall_s'] for r in rows]):.2f}, load average {os.getloadavg()[0]:.2f}",
                  flush=True)
    if a.json:
        a.json.write_text(json.dumps(raw, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
