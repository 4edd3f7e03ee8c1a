"""Write an H200 measurement of the GPU split into the package data (a thin entry point).

The measurement is the filter's own output on the shipped files, run on the GPU host:

    cuda-agent tasks filter tasks/builtin/gpu_eval.jsonl --device cuda --workers 16 --no-dedup \\
        --out gpu_eval_measured.jsonl --rejected gpu_eval_off_window.jsonl      (and the same for gpu_train)

Then, here: `python -m tasks.builtin.measure_gpu --eval gpu_eval_measured.jsonl --eval-rejected
gpu_eval_off_window.jsonl --train gpu_train_measured.jsonl --train-rejected gpu_train_off_window.jsonl
--note "..."`. Each split file is replaced by its measured tasks in their shipped order (metadata gets
eager_ms, compile_ms, gpu_timing_status "measured" or "contended", gpu_name, footprint_bytes, the filter's peak
memory); a task the filter rejected is dropped, and MANIFEST.json records why under "gpu_measured" with the
counts and the diversity of what is left. Raises SystemExit when a measured task is not in the split, or its
reference or sizes differ from the shipped ones (a measurement of something else).
"""

from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path

from tasks.builtin import HERE, split_path
from tasks.diversity import diversity_report
from tasks.schema import Task


def _read(path: str) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def apply(split: str, measured_path: str, rejected_path: str) -> tuple[list[Task], dict[str, str]]:
    """(the split's measured tasks in shipped order, {dropped task id: reason: detail})."""
    shipped = [Task.from_dict(d) for d in _read(str(split_path(split)))]
    by_id = {t.id: t for t in shipped}
    measured = {d["id"]: Task.from_dict(d) for d in _read(measured_path)}
    for tid, t in measured.items():
        old = by_id.get(tid)
        if old is None or old.reference != t.reference or old.shape_params != t.shape_params:
            raise SystemExit(f"{measured_path}: {tid} is not the shipped {split} task (missing, or other code/sizes)")
        if t.metadata.get("gpu_timing_status") not in ("measured", "contended"):
            raise SystemExit(f"{measured_path}: {tid} carries no GPU measurement (filtered with --device cuda?)")
    reasons = {d["task_id"]: f"{d['reason']}: {d.get('detail', '')[:200]}" for d in _read(rejected_path)}
    dropped = {t.id: reasons.get(t.id, "not in the measured output") for t in shipped if t.id not in measured}
    return [measured[t.id] for t in shipped if t.id in measured], dropped


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for s in ("eval", "train"):
        ap.add_argument(f"--{s}", required=True, help=f"the filter's --out on gpu_{s}.jsonl")
        ap.add_argument(f"--{s}-rejected", required=True, help=f"the filter's --rejected on gpu_{s}.jsonl")
    ap.add_argument("--note", default="", help="where and how it was measured (machine, date, command)")
    args = ap.parse_args(argv)
    kept: dict[str, list[Task]] = {}
    record: dict = {"applied": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                    "note": args.note, "dropped": {}, "counts": {}}
    for s in ("eval", "train"):
        tasks, dropped = apply(f"gpu_{s}", getattr(args, s), getattr(args, f"{s}_rejected"))
        kept[s] = tasks
        record["dropped"].update(dropped)
        record["counts"][f"gpu_{s}"] = len(tasks)
    if not all(kept.values()):
        raise SystemExit(f"a split would be empty ({ {s: len(t) for s, t in kept.items()} } kept): nothing written")
    rep = diversity_report(kept["train"] + kept["eval"])
    record["diversity"] = {"categories": rep.categories, "depths": {str(k): v for k, v in rep.depths.items()},
                           "problems": rep.problems}
    eager = sorted(t.metadata["eager_ms"] for s in kept.values() for t in s)
    record["eager_ms_min_median_max"] = [eager[0], eager[len(eager) // 2], eager[-1]]
    for s, tasks in kept.items():
        split_path(f"gpu_{s}").write_text("".join(json.dumps(t.to_dict()) + "\n" for t in tasks))
    manifest_path = HERE / "MANIFEST.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["gpu_measured"] = record
    manifest_path.write_text(json.dumps(manifest, indent=1) + "\n")
    print(json.dumps(record["counts"]), f"dropped {len(record['dropped'])}", json.dumps(record["diversity"]))


if __name__ == "__main__":
    main()
