"""The cost of the reward-integrity defences: evaluation time with and without them, on the honest CPU corpus.

"Without" is the sandbox as it was before the defences (a git revision, default the parent of the first
integrity commit), extracted with `git archive` into a temporary folder (the repository is not touched);
"with" is the working tree. Each side runs in its own long-lived process holding one `Evaluator` (so each keeps
its trusted worker, reference cache and zygote warm, as in service); evaluations alternate between the two, task
by task, so load on the host hits both alike. Per task: the median end-to-end time of `--evals` evaluations of
the task's `fast` solution (build cached after the first), its verify and profile stages, and the ratio.

    .venv/bin/python benchmarks/integrity_bench.py [--base REV] [--evals 3] [--tasks a,b] [--compile] [--format cubin]
        [--with-config '{"fresh_calls_per_rep_max": 4}'] [--json raw.json]

Prints a table; record the figures in benchmarks/RESULTS.md (date, machine, command). --with-config sets
SandboxConfig fields of the "with" side only (to weigh a knob); --json keeps every evaluation's stages, calls per
repetition and speed-up interval.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
import io
from pathlib import Path

from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parent.parent
CORPUS = REPO / "tests" / "data" / "corpus"
DEFAULT_BASE = "063c9e2"  # main just before the integrity work (sandbox core as the core engineer left it)

# The child: one Evaluator, evaluations on request (one JSON line in, one JSON line out).
CHILD = r"""
import json, sys, time
from pathlib import Path
from sandbox.config import SandboxConfig
from sandbox.evaluator import Evaluator
from sandbox.files import load_solution, load_task
cfg = json.loads(sys.argv[1])
corpus = Path(sys.argv[2])
fmt = sys.argv[3]
ev = Evaluator(SandboxConfig(**cfg))
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    task = line.strip()
    if not task:
        break
    t0 = time.perf_counter()
    r = ev.evaluate(load_task(corpus / task), load_solution(corpus / task / fmt / "fast"), fmt)
    wall = (time.perf_counter() - t0) * 1e3
    se = r.timing.speedup_eager if r.timing is not None else None
    print(json.dumps({"status": r.status, "reward": r.reward, "wall_ms": wall, "stage_ms": r.stage_ms,
                      "message": r.message[:200], "calls": r.timing.calls_per_rep if r.timing else 0,
                      "speedup_eager": [se.lo, se.point, se.hi] if se is not None else None,
                      "eager_ms": getattr(getattr(r.timing, "eager", None), "samples_ms", None),
                      "candidate_ms": getattr(getattr(r.timing, "candidate", None), "samples_ms", None),
                      "candidate_wall_ms": getattr(r.timing, "candidate_wall_ms", None),
                      "log": [x for x in getattr(r, "log", []) if "profile" in x][-8:]}), flush=True)
ev.close()
"""


_CALIB = re.compile(r"harness ([0-9.]+) ms per request \+ ([0-9.]+) ms per timed call")
_PART = re.compile(r"(\w+) (-?[0-9.]+|nan) ms")
_SHORT = re.compile(r"median shortfall (-?[0-9.]+) ms")


def parts_table(raw: dict, tasks: list[str]) -> Table:
    """The "with" side's profile logs per task: the calibrated costs (fixed per request, per call) against the
    candidate harness's own report of its time requests (pipe + checks, between calls), the median shortfall
    charged per repetition, the speed-up and the rewards; each cell "min-max" over the evaluations (a diagnostic:
    see "Where a time request's wall clock goes" in RESULTS.md)."""
    table = Table(title="with the defences: calibrated costs against the time requests (min-max over evaluations)")
    for col in ("task", "fixed ms", "pipe+checks ms", "per call ms", "between ms/call", "shortfall ms/rep",
                "speed-up", "rewards"):
        table.add_column(col, justify="right")

    def span(v: list[float]) -> str:
        return f"{min(v):.2f}-{max(v):.2f}" if v else "-"

    for t in tasks:
        cols: dict[str, list[float]] = {k: [] for k in ("fixed", "pc", "call", "between", "short", "speedup")}
        rewards = []
        for r in raw[t]["with"]:
            rewards.append(f"{r['reward']:g}")
            if r.get("speedup_eager"):
                cols["speedup"].append(r["speedup_eager"][1])
            for line in r.get("log", []):
                if (m := _CALIB.search(line)) and "calibrated before" in line:
                    cols["fixed"].append(float(m.group(1)))
                    cols["call"].append(float(m.group(2)))
                elif "candidate time requests" in line:
                    parts = {k: float(v) for k, v in _PART.findall(line.split(":", 2)[-1])}
                    if "pipe" in parts and "checks" in parts:
                        cols["pc"].append(parts["pipe"] + parts["checks"])
                    if "between_per_call" in parts:
                        cols["between"].append(parts["between_per_call"])
                elif m := _SHORT.search(line):
                    cols["short"].append(float(m.group(1)))
        table.add_row(t, *(span(cols[k]) for k in ("fixed", "pc", "call", "between", "short", "speedup")),
                      " ".join(rewards))
    return table


def _extract(rev: str, dest: Path) -> None:
    data = subprocess.run(["git", "-C", str(REPO), "archive", rev, "sandbox", "tasks", "cuda_agent"],
                          capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        tf.extractall(dest, filter="data")


class Side:
    def __init__(self, name: str, root: Path, cfg: dict, tmp: Path, fmt: str):
        env = dict(os.environ, PYTHONPATH=str(root))
        self.name = name
        self.proc = subprocess.Popen([sys.executable, "-c", CHILD, json.dumps(cfg), str(CORPUS), fmt], cwd=str(tmp),
                                     env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert json.loads(self.proc.stdout.readline())["ready"]

    def evaluate(self, task: str) -> dict:
        self.proc.stdin.write(task + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        try:
            self.proc.stdin.write("\n")
            self.proc.stdin.flush()
        except OSError:
            pass
        self.proc.wait(timeout=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", default=DEFAULT_BASE, help="revision without the defences")
    ap.add_argument("--evals", type=int, default=3, help="evaluations per task and side (after one warm-up)")
    ap.add_argument("--tasks", default="", help="comma-separated corpus tasks (default: all)")
    ap.add_argument("--compile", action="store_true", help="time the torch.compile baseline too (slow first call)")
    ap.add_argument("--json", default="", help="also write the raw figures here")
    ap.add_argument("--format", default="cpu", choices=("cpu", "cubin"),
                    help="the corpus's solutions to evaluate: cpu (cpu backend) or cubin (cuda backend, a GPU host)")
    ap.add_argument("--with-config", default="{}", help="JSON of SandboxConfig fields for the 'with' side only")
    a = ap.parse_args()
    tasks = a.tasks.split(",") if a.tasks else sorted(p.name for p in CORPUS.iterdir() if (p / "model.py").exists())
    tmp = Path(tempfile.mkdtemp(prefix="integrity-bench-"))
    base_root = tmp / "base"
    base_root.mkdir()
    _extract(a.base, base_root)
    common = dict(backend="cpu" if a.format == "cpu" else "cuda", use_compile=a.compile, isolation="auto")
    sides = [Side("without", base_root, {**common, "cache_dir": str(tmp / "c0"), "work_root": str(tmp / "w0")}, tmp, a.format),
             Side("with", REPO, {**common, **json.loads(a.with_config), "cache_dir": str(tmp / "c1"),
                                 "work_root": str(tmp / "w1")}, tmp, a.format)]
    raw: dict[str, dict[str, list[dict]]] = {t: {s.name: [] for s in sides} for t in tasks}
    try:
        for t in tasks:
            for s in sides:
                s.evaluate(t)  # warm-up: build, reference, zygote
            for i in range(a.evals):
                order = sides if i % 2 == 0 else sides[::-1]
                for s in order:
                    r = s.evaluate(t)
                    if r["status"] != "ok":
                        print(f"{s.name} {t}: {r['status']} {r['message']}", file=sys.stderr)
                    raw[t][s.name].append(r)
    finally:
        for s in sides:
            s.close()
    table = Table(title=f"evaluation time, honest {a.format} corpus (fast solutions), median of {a.evals}")
    for col in ("task", "without ms", "with ms", "ratio", "verify without/with ms", "profile without/with ms"):
        table.add_column(col, justify="right")
    ratios = []
    for t in tasks:
        w0 = statistics.median(r["wall_ms"] for r in raw[t]["without"])
        w1 = statistics.median(r["wall_ms"] for r in raw[t]["with"])
        v0 = statistics.median(r["stage_ms"].get("verify", 0) for r in raw[t]["without"])
        v1 = statistics.median(r["stage_ms"].get("verify", 0) for r in raw[t]["with"])
        p0 = statistics.median(r["stage_ms"].get("profile", 0) for r in raw[t]["without"])
        p1 = statistics.median(r["stage_ms"].get("profile", 0) for r in raw[t]["with"])
        ratios.append(w1 / w0)
        table.add_row(t, f"{w0:.0f}", f"{w1:.0f}", f"{w1 / w0:.2f}", f"{v0:.0f} / {v1:.0f}", f"{p0:.0f} / {p1:.0f}")
    gm = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
    tot0 = sum(statistics.median(r["wall_ms"] for r in raw[t]["without"]) for t in tasks)
    tot1 = sum(statistics.median(r["wall_ms"] for r in raw[t]["with"]) for t in tasks)
    table.add_row("geomean / sum", f"{tot0:.0f}", f"{tot1:.0f}", f"{gm:.2f} / {tot1 / tot0:.2f}", "", "")
    console = Console(width=160)  # logs on the GPU host are not a terminal: no truncated task names
    console.print(table)
    console.print(parts_table(raw, tasks))
    if a.json:
        Path(a.json).write_text(json.dumps(raw, indent=1))


if __name__ == "__main__":
    main()
