"""Fleet benchmark (issue 5): how many evaluations a sandbox node takes, with the training reward settings.

    python benchmarks/fleet_bench.py cpu --out OUTDIR [--workers 1,2] [--duration-s 240]
    python benchmarks/fleet_bench.py gpu --out OUTDIR [--budget-s 480] [--stop-s 20] [--mix fast=3,slow=1]

cpu: a local node on the CPU backend of this machine, for each worker count in --workers: a closed-loop run
     (concurrency = 2 x workers + 1, so the queue never runs dry) of corpus solutions in the cpu format (mix of
     correct fast / correct slow / wrong / crashing by default; no hangs, whose 30 s time limit would dominate)
     with the default SandboxConfig (the settings training rewards use: 5 checks, 20 interleaved repetitions,
     torch.compile baseline). Reports evaluations per hour, latency percentiles, per-stage p50 and worker busy.
gpu: a local node on every visible GPU (one worker per GPU, a build pool on the cores) with the cubin corpus.
     1. calibration: the tasks of the corpus at several sizes (first shape parameter scaled by --factors) are
        evaluated once each with their fast solution (cheap settings); the reference's eager time measured there
        puts the variant in a bucket (< 1 ms, 1-10 ms, 10-100 ms), up to --per-bucket variants per bucket, within
        a quarter of --budget-s;
        the buckets that the GPU split's measured tasks with cubin demonstrations fall in (--split: 1-10 ms and
        10-100 ms with the built-in split; its fused demonstration is the fast kind, its naive one the slow kind)
        take --split-per-bucket of those tasks instead;
     2. per bucket: one unmeasured evaluation per variant (compiles its torch.compile baseline in the worker,
        as training does once per task), then a closed-loop run at saturation (concurrency = 3 x GPUs + 2) of
        that bucket's variants with the --mix of kinds, for an equal share of the remaining --budget-s;
     reports per bucket: evaluations per GPU-hour, GPU busy fraction (NVML, sampled by the node), latency
     percentiles, per-stage p50. Goal for the < 1 ms bucket: >= 2,000 evaluations per GPU-hour with GPU busy
     >= 70% (the published reference is about 100). NVML's figure counts any kernel resident, so the timing
     gate's hold while a timed call is enqueued (sandbox.timing_gate) counts as busy: read it next to the
     evaluation rate and the per-stage p50, not alone. Needs the cubin corpus (tests/data/corpus/<task>/cubin/) and
     hdrhistogram, prometheus-client and nvidia-ml-py on the GPU host.
Both write fleet_bench.json and the stress reports (markdown, PNG, JSON) of each run under --out, and print a
table last.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sandbox.client import SandboxClient  # noqa: E402
from sandbox.stress import (DEFAULT_CORPUS, LocalNode, Solution, StressConfig, load_corpus, parse_mix,  # noqa: E402
                            run_stress)

BUCKETS = (("<1ms", 0.0, 1.0), ("1-10ms", 1.0, 10.0), ("10-100ms", 10.0, 100.0))
BUILTIN = str(Path(__file__).resolve().parent.parent / "tasks" / "builtin")


def _safe(name: str) -> str:
    """A bucket's name as a folder name (no '<': such files do not travel back from the GPU host)."""
    return name.replace("<", "lt").replace(">", "gt")


def _machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at start"


def _row(label: str, run: dict[str, Any], gpus: int = 0) -> dict[str, Any]:
    st = run["stage_ms"]
    out = {"run": label, "results": run["results"], "errors": sum(run["errors"].values()),
           "evaluations_per_hour": run["evaluations_per_hour"],
           "p50_ms": run["latency_ms"].get("p50_ms"), "p99_ms": run["latency_ms"].get("p99_ms"),
           "worker_busy": run["nodes"].get("worker_busy_fraction"), "gpu_busy": run["nodes"].get("gpu_busy_fraction"),
           "worker_restarts": run["nodes"].get("worker_restarts"),
           "stage_p50_ms": {k: v.get("p50_ms") for k, v in st.items()}, "status_by_kind": run["status_by_kind"]}
    if gpus:
        out["evaluations_per_gpu_hour"] = run["evaluations_per_hour"] / gpus
    return out


def _print_table(rows: list[dict[str, Any]], gpu: bool) -> None:
    head = ["run", "results", "errors", "eval/h", "eval/GPU-h" if gpu else "", "p50 s", "p99 s", "worker busy",
            "GPU busy" if gpu else ""]
    head = [h for h in head if h]
    print(" | ".join(head))
    for r in rows:
        cells = [r["run"], str(r["results"]), str(r["errors"]), f"{r['evaluations_per_hour']:,.0f}"]
        if gpu:
            cells.append(f"{r.get('evaluations_per_gpu_hour', 0):,.0f}")
        cells += [f"{(r['p50_ms'] or 0) / 1e3:.1f}", f"{(r['p99_ms'] or 0) / 1e3:.1f}",
                  "n/a" if r["worker_busy"] is None else f"{r['worker_busy']:.0%}"]
        if gpu:
            cells.append("n/a" if r["gpu_busy"] is None else f"{r['gpu_busy']:.0%}")
        print(" | ".join(cells))


# ------------------------------------------------------------------------------------------------ cpu
def bench_cpu(args: argparse.Namespace) -> dict[str, Any]:
    corpus = load_corpus(args.corpus, "cpu", None)
    mix = parse_mix(args.mix or "fast=2,slow=1,wrong=1,crash=1")
    rows, runs = [], {}
    for w in [int(x) for x in args.workers.split(",")]:
        out = Path(args.out) / f"cpu-w{w}"
        out.mkdir(parents=True, exist_ok=True)
        node = LocalNode(["sandbox.backend=cpu", f"workers={w}", f"queue_max={4 * w + 4}"], log_path=out / "node.log")
        try:
            with SandboxClient([node.endpoint], client_id="fleet-bench") as c:
                c.wait_for_nodes(timeout_s=120)
                # warm-up: each task's torch.compile baseline is compiled once per worker (15-18 s on 2 cores)
                warm = StressConfig(mode="concurrency", concurrency=w, jobs=len(corpus.get("fast", [])) * w,
                                    mix={"fast": 1}, deadline_s=900, seed=args.seed)
                run_stress(c, {"fast": corpus["fast"]}, warm)
                load = StressConfig(mode="concurrency", concurrency=2 * w + 1, duration_s=args.duration_s, mix=mix,
                                    deadline_s=900, seed=args.seed)
                report, _ = run_stress(c, corpus, load, out_dir=out)
        finally:
            node.stop()
        runs[f"workers={w}"] = report["run"]
        rows.append(_row(f"cpu, {w} worker(s)", report["run"]))
    return {"rows": rows}


# ------------------------------------------------------------------------------------------------ gpu
def scaled_task(task: dict[str, Any], factor: int) -> dict[str, Any] | None:
    """The task with its first shape parameter multiplied by `factor` (module-level constant rewritten in the
    reference); None when it has no shape parameter."""
    params = task.get("shape_params") or {}
    if not params:
        return None
    name, value = next(iter(params.items()))
    new = max(1, int(value * factor))
    ref, n = re.subn(rf"^{re.escape(name)}\s*=\s*\d+\s*$", f"{name} = {new}", task["reference"], count=1, flags=re.M)
    if n != 1:
        return None
    return dict(task, id=f"{task['id']}_x{factor}", reference=ref, shape_params=dict(params, **{name: new}))



def corpus_task(name: str, factor: int, corpus: Path = DEFAULT_CORPUS) -> "Task":
    """The corpus task `name` as a tasks.schema.Task, its first shape parameter scaled by factor (1 = as it is).
    Raises SystemExit when the task has no shape parameter to scale."""
    from sandbox.files import load_task
    from tasks.schema import Task

    meta = load_task(Path(corpus) / name).to_dict()
    if factor != 1:
        meta = scaled_task(meta, factor)
        if meta is None:
            raise SystemExit(f"{name} has no shape parameter to scale")
    return Task.from_dict(meta)

def split_sets(split_files: list[str], demos_file: str, per_bucket: int) -> dict[str, list[dict[str, Solution]]]:
    """Per bucket, up to `per_bucket` tasks of the GPU split (tasks whose metadata holds an eager time measured on
    the H200, `eager_ms_source` "measured") that have cubin demonstrations: the "fused" one as the fast kind and
    the "naive" one as the slow kind. The tasks with the smallest `footprint_bytes` come first (their evaluations
    move the least data). Returns {bucket name: [{kind: Solution}]}, only buckets that got a task."""
    from tasks.schema import Task

    demos: dict[tuple[str, str], dict[str, str]] = {}
    for line in Path(demos_file).read_text().splitlines():
        d = json.loads(line)
        if d["format"] == "cubin":
            demos[(d["task_id"], d["variant"])] = d["files"]
    found: dict[str, list[tuple[int, dict[str, Solution]]]] = {b[0]: [] for b in BUCKETS}
    for f in split_files:
        for line in Path(f).read_text().splitlines():
            task = Task.from_dict(json.loads(line)).to_dict()
            meta = task.get("metadata") or {}
            eager = meta.get("eager_ms")
            if meta.get("eager_ms_source") != "measured" or not isinstance(eager, (int, float)):
                continue
            if (task["id"], "fused") not in demos:
                continue
            kinds = {"fast": "fused", "slow": "naive"}
            sols = {k: Solution(k, f"{task['id']}/{v}", task, demos[(task["id"], v)], "cubin")
                    for k, v in kinds.items() if (task["id"], v) in demos}
            for name, lo, hi in BUCKETS:
                if lo <= eager < hi:
                    found[name].append((int(meta.get("footprint_bytes") or 0), sols))
    return {name: [s for _, s in sorted(v, key=lambda x: x[0])[:per_bucket]] for name, v in found.items() if v}


def bench_gpu(args: argparse.Namespace) -> dict[str, Any]:
    from sandbox.service import visible_gpus

    t_start = time.monotonic()
    gpus = visible_gpus()
    if not gpus:
        raise SystemExit("fleet_bench gpu: no GPU visible")
    corpus = load_corpus(args.corpus, "cubin", None)
    if not corpus.get("fast"):
        raise SystemExit(f"fleet_bench gpu: no cubin fast solutions under {args.corpus}")
    factors = [int(f) for f in args.factors.split(",")]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    workers = args.gpu_workers or len(gpus)  # several per GPU: their untimed work overlaps the exclusive timing
    node = LocalNode(["sandbox.backend=cuda", f"workers={workers}", f"queue_max={8 * workers + 8}",
                      "log_interval_s=10"], log_path=out / "node.log")
    rows, calibration = [], []
    try:
        with SandboxClient([node.endpoint], client_id="fleet-bench") as c:
            c.wait_for_nodes(timeout_s=300)
            # 1. calibration: eager time of each variant from one cheap evaluation of its fast solution (no
            #    torch.compile, few repetitions); factor by factor, until every bucket has --per-bucket variants or
            #    a quarter of the budget is spent
            variants: dict[str, list[tuple[dict, Solution]]] = {b[0]: [] for b in BUCKETS}
            # buckets the GPU split fills (its tasks' eager times were measured on the H200 when it was built):
            # the corpus sizes are searched only for the others
            split = (split_sets([x for x in args.split.split(",") if x], args.split_demos, args.split_per_bucket)
                     if args.split else {})
            split = {name: sets for name, sets in split.items() if name in args.buckets}
            for name, sets in split.items():
                print(f"[{time.monotonic() - t_start:5.0f} s] bucket {name} from the GPU split: "
                      + ", ".join(f"{d['fast'].task['id']} ({d['fast'].task['metadata']['eager_ms']:.1f} ms)"
                                  for d in sets), flush=True)
            need = [b[0] for b in BUCKETS if b[0] not in split and b[0] in args.buckets]
            quick = {"use_compile": False, "reps": 5, "num_trials": 1}
            for f in factors:
                for sol in corpus["fast"]:
                    if not need or all(len(variants[b]) >= args.per_bucket for b in need) or \
                            time.monotonic() - t_start > args.budget_s / 4:
                        break
                    task = sol.task if f == 1 else scaled_task(sol.task, f)
                    if task is None:
                        continue
                    try:
                        r = c.evaluate(task, sol.files, "cubin", settings=quick, deadline_s=600, priority=0)
                    except Exception as e:  # noqa: BLE001 - a variant that does not run is left out
                        calibration.append({"task": task["id"], "error": str(e)})
                        continue
                    eager = (r.result.get("timing") or {}).get("eager", {}).get("median_ms")
                    calibration.append({"task": task["id"], "status": r.status, "eager_ms": eager,
                                        "total_ms": r.result["stage_ms"].get("total")})
                    print(f"[{time.monotonic() - t_start:5.0f} s] calibration: {task['id']} {r.status}, eager "
                          f"{eager if eager is None else round(eager, 3)} ms", flush=True)
                    for name, lo, hi in BUCKETS:
                        if eager is not None and lo <= eager < hi and name in need and \
                                len(variants[name]) < args.per_bucket:
                            variants[name].append((task, sol))
            # 2. per bucket, saturation with the mix of kinds on that bucket's tasks
            mix = parse_mix(args.mix)
            buckets = [b for b in BUCKETS if variants[b[0]] or b[0] in split]
            for i, (name, _, _) in enumerate(buckets):
                left = args.budget_s - args.stop_s - (time.monotonic() - t_start)
                share = left / (len(buckets) - i)
                if share < 30:
                    print(f"fleet_bench gpu: budget spent before bucket {name}", file=sys.stderr)
                    break
                bucket_end = time.monotonic() + share
                sub: dict[str, list[Solution]] = {}
                warm: list[tuple[dict, dict[str, str]]] = []
                for vtask, base in variants[name]:  # every kind of solution of the base task, on this size
                    for kind, sols in corpus.items():
                        sub.setdefault(kind, []).extend(dataclasses.replace(s, task=vtask) for s in sols
                                                        if s.task["id"] == base.task["id"])
                    warm.append((vtask, base.files))
                for sols in split.get(name, []):
                    for kind, sol in sols.items():
                        sub.setdefault(kind, []).append(sol)
                    warm.append((sols["fast"].task, sols["fast"].files))
                n_sizes = len(warm)
                for vtask, files in warm:  # warm-up, not measured: each size's torch.compile baseline
                    c.evaluate(vtask, files, "cubin", deadline_s=600, priority=0,
                               settings={"cache_salt": f"warm-{time.time()}"})
                # the measured run gets what the warm-ups left of this bucket's share, less its drain (the larger
                # buckets' warm-ups take tens of seconds: a share fixed before them overran the budget)
                drain_s = min(60.0, max(10.0, 0.25 * (bucket_end - time.monotonic())))
                load = StressConfig(mode="concurrency", concurrency=3 * workers + 2, mix=mix, deadline_s=600,
                                    duration_s=max(20.0, bucket_end - time.monotonic() - drain_s), seed=args.seed,
                                    drain_s=drain_s)
                report, _ = run_stress(c, sub, load, out_dir=out / f"bucket-{_safe(name)}")
                src = "GPU split" if name in split else "corpus"
                rows.append(_row(f"cubin, eager {name}, {n_sizes} task size(s) ({src}), {workers} worker(s)",
                                 report["run"], len(gpus)))
                # each bucket's row as soon as it is measured: a run cut by its time limit still reports
                _print_table(rows[-1:], True)
                (out / "fleet_bench.partial.json").write_text(json.dumps(
                    {"rows": rows, "calibration": calibration, "gpus": gpus}, indent=1, default=str))
    finally:
        # the node's drain gets what --stop-s reserved, then it is killed (jobs still running then are the load's
        # last, already outside every measured row): a drain of the 600 s job deadline overran the budget
        node.stop(timeout_s=args.stop_s)
    return {"rows": rows, "calibration": calibration, "gpus": gpus, "workers": workers}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("backend", choices=("cpu", "gpu"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--corpus", default=str(DEFAULT_CORPUS))
    ap.add_argument("--mix", default=None, help="kinds and weights (cpu default fast=2,slow=1,wrong=1,crash=1; "
                    "gpu default fast=3,slow=1)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", default="1,2", help="cpu: worker counts to measure")
    ap.add_argument("--duration-s", type=float, default=240.0, help="cpu: seconds of load per worker count")
    ap.add_argument("--budget-s", type=float, default=480.0, help="gpu: total seconds (calibration included)")
    ap.add_argument("--gpu-workers", type=int, default=0, help="gpu: the node's verify/profile workers (0 = one per "
                    "GPU, the node's default; more share each GPU: verification overlaps, profiles take turns)")
    ap.add_argument("--stop-s", type=float, default=20.0, help="gpu: seconds of --budget-s kept for the node's "
                    "drain at the end (then it is killed)")
    ap.add_argument("--factors", default="1,16,256", help="gpu: scales of the first shape parameter (corpus sizes "
                    "for the buckets the GPU split leaves empty)")
    ap.add_argument("--per-bucket", type=int, default=3, help="gpu: corpus task sizes per bucket")
    ap.add_argument("--split", default=f"{BUILTIN}/gpu_train.jsonl,{BUILTIN}/gpu_eval.jsonl",
                    help="gpu: task files of the GPU split whose measured tasks with cubin demonstrations fill the "
                         "buckets they fall in (empty: corpus sizes only)")
    ap.add_argument("--split-demos", default=f"{BUILTIN}/demos.jsonl", help="gpu: the GPU split's demonstrations")
    ap.add_argument("--split-per-bucket", type=int, default=1, help="gpu: GPU-split tasks per bucket (each "
                    "evaluation of one moves GiBs: tens of seconds)")
    ap.add_argument("--buckets", default="lt1ms,1-10ms,10-100ms", help="gpu: the buckets to measure, of lt1ms "
                    "(< 1 ms), 1-10ms, 10-100ms: the budget is shared among these only")
    args = ap.parse_args()
    names = {_safe(b[0]): b[0] for b in BUCKETS}
    asked = [x.strip() for x in args.buckets.split(",") if x.strip()]
    unknown = [x for x in asked if x not in names and x not in names.values()]
    if unknown or not asked:
        ap.error(f"--buckets: unknown {unknown or 'empty list'}; choose from {', '.join(names)}")
    args.buckets = {names.get(x, x) for x in asked}
    if args.backend == "gpu" and args.mix is None:
        args.mix = "fast=3,slow=1"
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    machine = _machine()
    res = bench_cpu(args) if args.backend == "cpu" else bench_gpu(args)
    res.update(date=started, machine=machine, command=" ".join(sys.argv))
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "fleet_bench.json").write_text(json.dumps(res, indent=1, default=str))
    print(f"fleet_bench {args.backend}: {started}, {machine}")
    _print_table(res["rows"], args.backend == "gpu")
    return 0


if __name__ == "__main__":
    sys.exit(main())
