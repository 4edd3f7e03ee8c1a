"""Cost of the profile's harness calibration per evaluation, measured in every evaluation against reused
(SandboxConfig.calibration_reuse_evals), side by side in one run.

    python benchmarks/calibration_bench.py --format cubin --task elementwise_chain --factor 256 --evals 3 \
        [--json OUT.json]

One Evaluator per setting (reuse off: calibration_reuse_evals=0, the default; reuse on: 16), each evaluating the
corpus task's fast solution (first shape parameter scaled by --factor, as benchmarks/fleet_bench.py scales its
buckets) --evals times. Prints, per evaluation, the calibration and total ms, the reward and whether the harness
costs were reused; then the median calibration ms of each setting and their ratio. The first evaluation of each
Evaluator pays the task's one-time costs (reference, torch.compile); medians are over the later ones.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fleet_bench import corpus_task  # noqa: E402

from sandbox.config import SandboxConfig  # noqa: E402
from sandbox.evaluator import Evaluator  # noqa: E402
from sandbox.files import load_solution  # noqa: E402
from sandbox.stress import DEFAULT_CORPUS  # noqa: E402


def run(fmt: str, task_name: str, factor: int, evals: int, reuse: bool, work: Path) -> list[dict]:
    corpus = Path(DEFAULT_CORPUS)
    task = corpus_task(task_name, factor)
    files = load_solution(corpus / task_name / fmt / "fast")
    backend = "cpu" if fmt == "cpu" else "cuda"
    cfg = SandboxConfig(backend=backend, cache_dir=str(work / "cache"), work_root=str(work / "ws"),
                        calibration_reuse_evals=16 if reuse else 0)
    ev = Evaluator(cfg)
    rows = []
    try:
        for i in range(evals):
            t = time.perf_counter()
            r = ev.evaluate(task, files, fmt)
            rows.append({"reuse": reuse, "eval": i, "status": r.status, "reward": r.reward,
                         "calibration_ms": r.stage_ms.get("calibration"), "total_ms": r.stage_ms.get("total"),
                         "wall_s": time.perf_counter() - t,
                         "reused": any("harness costs reused" in line for line in r.log)})
            print(json.dumps(rows[-1]), flush=True)
    finally:
        ev.close()
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--format", default="cubin", choices=("cubin", "cpu"))
    ap.add_argument("--task", default="elementwise_chain", help="a corpus task with a fast solution in --format")
    ap.add_argument("--factor", type=int, default=256, help="scale of the task's first shape parameter")
    ap.add_argument("--evals", type=int, default=3, help="evaluations per setting (>= 2)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/cuda-agent-calibration-bench"))
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.evals < 2:
        ap.error("--evals must be >= 2 (the first evaluation of each setting pays one-time costs)")
    rows = []
    for reuse in (False, True):
        rows += run(args.format, args.task, args.factor, args.evals, reuse, args.work / ("on" if reuse else "off"))
    med = {}
    for reuse in (False, True):
        later = [r["calibration_ms"] for r in rows if r["reuse"] == reuse and r["eval"] > 0
                 and r["calibration_ms"] is not None]
        med[reuse] = statistics.median(later) if later else float("nan")
    print(f"\n{args.task} x{args.factor} ({args.format}): calibration ms per evaluation after the first, median: "
          f"measured {med[False]:.0f}, reused {med[True]:.0f} (ratio {med[False] / max(med[True], 1e-9):.1f}x)")
    print("| setting | eval | status | reward | calibration ms | total ms | reused |")
    print("| --- | ---: | --- | ---: | ---: | ---: | --- |")
    for r in rows:
        print(f"| {'reuse' if r['reuse'] else 'measure'} | {r['eval']} | {r['status']} | {r['reward']} | "
              f"{r['calibration_ms'] or 0:.0f} | {r['total_ms'] or 0:.0f} | {r['reused']} |")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "median_calibration_ms": {"measure": med[False],
                                                                                   "reuse": med[True]}}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
