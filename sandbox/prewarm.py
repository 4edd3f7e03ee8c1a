"""Compile tasks' torch.compile baselines before their first evaluation: `python -m sandbox.prewarm`.

A task's first evaluation pays torch.compile's first call on its reference (inductor's code generation and the
host compiler): 15-18 s per task on the 2-core CPU machine, and up to 90 s per task on a 16-core GPU host while
three runs shared it (`sandbox/profile_p95_ms` of the first evaluation, session 19). The evaluation that follows
`cuda-agent train`'s warm start met all of them at once. This process compiles the references ahead of time, the
way the trusted worker does (`reference_worker.TaskState.compiled_model`: the task's pristine source, the same
compile mode, the same input shapes and dtypes, `cpu_threads` torch threads), in the sandbox node's environment
(`TORCHINDUCTOR_CACHE_DIR`, `TORCHINDUCTOR_COMPILE_THREADS`). A node's worker then finds the compiled graph in
inductor's FX graph cache; dynamo still traces the module (about a second).

Nothing here is trusted with a result: it only fills a cache that the node also fills itself. A task whose
reference fails or does not compile is recorded and skipped (the node reports the same failure in its
evaluation).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import secrets
import sys
import time
from pathlib import Path
from typing import Sequence

from sandbox.config import SandboxConfig
from tasks.schema import Task


@dataclasses.dataclass
class PrewarmResult:
    """One task's prewarm.

    task_id: the task. status: "compiled", "compile_failed" (torch.compile raised: the node times no compile
    baseline for it either), "reference_failed" (the reference did not build or run) or "skipped" (the deadline
    passed first). compile_s: seconds of torch.compile's first call (0 unless compiled). message: the error, if
    any (at most 300 characters)."""

    task_id: str
    status: str
    compile_s: float = 0.0
    message: str = ""


def prewarm_baselines(tasks: Sequence[Task], cfg: SandboxConfig, device: str = "cpu",
                      deadline_s: float | None = None, log=None) -> list[PrewarmResult]:
    """Compile each task's reference with torch.compile(mode=cfg.compile_mode) on `device`, in order.

    Args:
      tasks: tasks in the order to compile them (the soonest evaluated first).
      cfg: the node's sandbox settings (compile_mode, use_compile, cpu_threads).
      device: "cpu" or "cuda:N", as the node's trusted worker evaluates on.
      deadline_s: stop starting new tasks after this many seconds (None: no limit); the rest are "skipped".
      log: a callable taking one line per task (None: quiet).
    Returns one PrewarmResult per task, in order. Raises nothing for a bad task (it is recorded)."""
    import torch

    from sandbox.reference_worker import TaskState, scrub_device

    torch.set_num_threads(cfg.cpu_threads)  # as the trusted worker's profile, which compiles the baseline
    t0 = time.monotonic()
    out: list[PrewarmResult] = []
    for task in tasks:
        if not cfg.use_compile or (deadline_s is not None and time.monotonic() - t0 > deadline_s):
            out.append(PrewarmResult(task.id, "skipped"))
            continue
        try:
            state = TaskState(task.reference, task.id, device)
            x0 = state.to_device(state.make_inputs(secrets.randbits(62)))
        except Exception as e:  # noqa: BLE001 - recorded, the next task goes on
            out.append(PrewarmResult(task.id, "reference_failed", message=f"{type(e).__name__}: {e}"[:300]))
        else:
            ts = time.monotonic()
            compiled = state.compiled_model(cfg.compile_mode, x0)
            dt = time.monotonic() - ts
            out.append(PrewarmResult(task.id, "compiled", dt) if compiled is not None
                       else PrewarmResult(task.id, "compile_failed", message=state.compile_error[:300]))
            scrub_device(x0)
            del state, x0, compiled
            if device.startswith("cuda"):
                torch.cuda.empty_cache()  # the GPU is shared with the run's learner and actors
        if log is not None:
            r = out[-1]
            log(f"prewarm {r.task_id}: {r.status}" + (f" in {r.compile_s:.1f} s" if r.compile_s else "")
                + (f" ({r.message})" if r.message else ""))
    return out


def main(argv: list[str] | None = None) -> int:
    """`python -m sandbox.prewarm NODE_YAML TASKS.jsonl [TASKS.jsonl ...] [--device cpu] [--out prewarm.json]`.

    NODE_YAML: the node's config (`sandbox serve`'s; its `sandbox` section is used). Tasks appearing in several
    files are compiled once. Writes the results as JSON to --out (and a summary line on stdout). Exit 0 even when
    some tasks failed (they are in the file); 2 on unreadable input."""
    from cuda_agent.config import ConfigError, load_config
    from sandbox.service import ServiceConfig
    from tasks.loaders import load_jsonl

    ap = argparse.ArgumentParser(prog="python -m sandbox.prewarm", description=main.__doc__)
    ap.add_argument("node_yaml")
    ap.add_argument("tasks", nargs="+", help="JSONL task files, soonest evaluated first")
    ap.add_argument("--device", default="cpu", help="cpu or cuda:N")
    ap.add_argument("--deadline-s", type=float, default=None)
    ap.add_argument("--out", default="")
    a = ap.parse_args(argv)
    try:
        cfg = load_config(ServiceConfig, a.node_yaml).sandbox
        seen: set[str] = set()
        tasks = []
        for path in a.tasks:
            for t in load_jsonl(path):
                if t.id not in seen:
                    seen.add(t.id)
                    tasks.append(t)
    except (ConfigError, OSError, ValueError) as e:
        print(f"prewarm: {e}", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    res = prewarm_baselines(tasks, cfg, a.device, a.deadline_s, log=lambda s: print(s, flush=True))
    counts: dict[str, int] = {}
    for r in res:
        counts[r.status] = counts.get(r.status, 0) + 1
    summary = {"tasks": len(res), "wall_s": round(time.monotonic() - t0, 3), "counts": counts,
               "results": [dataclasses.asdict(r) for r in res]}
    if a.out:
        Path(a.out).write_text(json.dumps(summary, indent=1) + "\n")
    print(f"prewarm: {len(res)} task(s) in {summary['wall_s']:.1f} s: {counts}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
