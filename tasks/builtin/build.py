"""Build the built-in splits: `python -m tasks.builtin.build [--cpu 100] [--gpu 100] [--eval 20] [--work DIR]`.

1. CPU split: synthesize `--cpu` tasks (seed 1001) with the full CPU filter (eager and torch.compile,
   determinism, degeneracy, liveness, 0.1-20 ms eager at one thread, autosize), then set aside `--eval` of
   them as cpu_eval, stratified by category (lowest content hashes of each category, largest-remainder
   allocation), the rest cpu_train.
2. GPU split: synthesize `--gpu` more tasks (seed 2002) the same way, rejecting near-duplicates of the CPU
   split, then re-size each toward 10 ms estimated eager time on an H200 (tasks.sizing; kept when the
   estimate lies in 2-50 ms), and split train/eval as above. Their times are estimates until measured.
3. Write cpu_train/cpu_eval/gpu_train/gpu_eval.jsonl next to this file and MANIFEST.json (counts, seeds,
   versions, diversity). Work files (resumable synthesis state) go to `--work`.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import platform
import sys
from collections import defaultdict
from pathlib import Path

from tasks.builtin import HERE
from tasks.diversity import diversity_report
from tasks.filtering import FilterConfig
from tasks.loaders import load_jsonl, write_jsonl
from tasks.schema import Task
from tasks.sizing import H200, footprint_bytes, resize_for_target, trace_with
from tasks.synthesize import SynthesisConfig, Synthesizer

GPU_TARGET_MS = 4.0  # 4x above the window's 1 ms floor: room for the estimate's error without huge tensors
GPU_KEEP_MS = (1.5, 50.0)
GPU_MEMORY = H200.__class__(**{**H200.__dict__, "memory_bytes": 16 << 30})  # footprint cap per task


def stratified_eval(tasks: list[Task], n_eval: int) -> tuple[list[Task], list[Task]]:
    """(train, eval): eval takes about n_eval tasks, spread over categories in proportion."""
    by_cat: dict[str, list[Task]] = defaultdict(list)
    for t in tasks:
        by_cat[t.category].append(t)
    total = len(tasks)
    quotas = {c: n_eval * len(ts) / total for c, ts in by_cat.items()}
    alloc = {c: int(q) for c, q in quotas.items()}
    for c in sorted(quotas, key=lambda c: quotas[c] - alloc[c], reverse=True)[: n_eval - sum(alloc.values())]:
        alloc[c] += 1
    eval_ids = set()
    for c, ts in by_cat.items():
        for t in sorted(ts, key=lambda t: t.content_hash)[: alloc[c]]:
            eval_ids.add(t.id)
    return [t for t in tasks if t.id not in eval_ids], [t for t in tasks if t.id in eval_ids]


def renumber(tasks: list[Task], prefix: str, split: str) -> list[Task]:
    out = []
    for i, t in enumerate(tasks):
        out.append(t.replace(id=f"{prefix}_{i:03d}", source="builtin",
                             metadata={**t.metadata, "split": split},
                             provenance={**t.provenance, "synthesized_id": t.id}))
    return out


def gpu_sized(t: Task) -> Task | None:
    """The task re-sized toward GPU_TARGET_MS on an H200 (estimate), or None when it cannot get there."""
    from tasks.reference import with_shape_params

    params, est = resize_for_target(t.reference, t.shape_params, GPU_TARGET_MS, GPU_MEMORY, t.id)
    if not GPU_KEEP_MS[0] <= est <= GPU_KEEP_MS[1]:
        return None
    tr = trace_with(t.reference, params, t.id)
    meta = {k: v for k, v in t.metadata.items() if k not in ("eager_ms", "compile_ms", "flops", "bytes")}
    meta.update(
        size="gpu", cpu_shape_params=dict(t.shape_params), cpu_eager_ms=t.metadata.get("eager_ms"),
        cpu_compile_ms=t.metadata.get("compile_ms"), eager_ms_estimate_h200=round(est, 3),
        eager_ms_source=f"estimate: tasks.sizing.{H200.name} roofline, not measured",
        gpu_timing_status="unmeasured", flops=tr.total_flops, bytes=tr.total_bytes,
        footprint_bytes=footprint_bytes(tr),
    )
    return t.replace(reference=with_shape_params(t.reference, params, t.id), shape_params=params, metadata=meta)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cpu", type=int, default=100)
    ap.add_argument("--gpu", type=int, default=100)
    ap.add_argument("--eval", type=int, default=20, help="eval tasks per split")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--work", default="runs/builtin_build")
    ap.add_argument("--out", default=str(HERE))
    args = ap.parse_args(argv)
    work, out = Path(args.work), Path(args.out)
    work.mkdir(parents=True, exist_ok=True)

    def synth(n: int, seed: int, name: str, exclude: list[str]):
        cfg = SynthesisConfig(n=n, out=str(work / f"{name}.jsonl"), seed=seed, exclude=exclude,
                              filter=FilterConfig(autosize=True, workers=args.workers))

        def progress(rep) -> None:
            if rep.run_candidates % 20 == 0:
                print(f"  {name}: {rep.accepted}/{n} accepted of {rep.candidates} candidates, "
                      f"{rep.accepted_per_min:.1f}/min", flush=True)

        rep = Synthesizer(cfg).run(on_progress=progress)
        print(f"{name}: accepted {rep.accepted} of {rep.candidates} in {rep.elapsed_s:.0f} s; rejections {rep.reasons}",
              flush=True)
        return load_jsonl(cfg.out), rep

    cpu_tasks, cpu_rep = synth(args.cpu, 1001, "cpu", [])
    cpu_train, cpu_eval = stratified_eval(cpu_tasks, args.eval)
    gpu_raw, gpu_rep = synth(args.gpu, 2002, "gpu_cpusize", [str(work / "cpu.jsonl")])
    gpu_tasks = [g for g in (gpu_sized(t) for t in gpu_raw) if g is not None]
    print(f"gpu: {len(gpu_tasks)} of {len(gpu_raw)} reach {GPU_KEEP_MS} ms (estimated)", flush=True)
    gpu_train, gpu_eval = stratified_eval(gpu_tasks, args.eval)
    splits = {
        "cpu_train": renumber(cpu_train, "cpu_tr", "cpu_train"),
        "cpu_eval": renumber(cpu_eval, "cpu_ev", "cpu_eval"),
        "gpu_train": renumber(gpu_train, "gpu_tr", "gpu_train"),
        "gpu_eval": renumber(gpu_eval, "gpu_ev", "gpu_eval"),
    }
    for name, ts in splits.items():
        write_jsonl(ts, out / f"{name}.jsonl")
    import torch

    manifest = {
        "built": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": "python -m tasks.builtin.build " + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "torch": torch.__version__, "python": platform.python_version(),
        "seeds": {"cpu": 1001, "gpu": 2002},
        "counts": {k: len(v) for k, v in splits.items()},
        "synthesis": {
            "cpu": {"accepted": cpu_rep.accepted, "candidates": cpu_rep.candidates, "rejections": cpu_rep.reasons},
            "gpu": {"accepted": gpu_rep.accepted, "candidates": gpu_rep.candidates, "rejections": gpu_rep.reasons,
                    "reach_gpu_window_estimate": len(gpu_tasks)},
        },
        "gpu_sizing": {"target_ms": GPU_TARGET_MS, "kept_if_estimate_ms_in": list(GPU_KEEP_MS),
                       "device_model": GPU_MEMORY.__dict__},
        "diversity": {
            name: {"categories": rep.categories, "depths": {str(k): v for k, v in rep.depths.items()},
                   "problems": rep.problems}
            for name, rep in (("cpu", diversity_report(splits["cpu_train"] + splits["cpu_eval"])),
                              ("gpu", diversity_report(splits["gpu_train"] + splits["gpu_eval"])))
        },
    }
    (out / "MANIFEST.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print(json.dumps(manifest["counts"]), json.dumps(manifest["diversity"], indent=1))


if __name__ == "__main__":
    main()
