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
evaluation). The thread count is part of inductor's cache key on the CPU: the worker compiles in `_profile` after
`torch.set_num_threads(cpu_threads)`, as here; a job whose settings change `cpu_threads` or `compile_mode` misses.

On a GPU this process takes no timing lock, and Triton's config choices benchmarked here beside other GPU work
must not become the node's: it switches inductor's on-disk autotune cache off (`autotune_local_cache`, not part
of the FX graph key), so the node benchmarks them again under its exclusive lock, and it refuses max-autotune
modes, whose template choice is part of the cached graph. `cuda-agent train` prewarms on the CPU backend only;
run it by hand on a GPU that nothing is timing on.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import secrets
import sys
import time
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
      log: called with each task's PrewarmResult as soon as it is known (None: quiet).
    Returns one PrewarmResult per task, in order. Raises nothing for a bad task (it is recorded); ValueError for a
    max-autotune compile mode on a GPU."""
    import torch

    from sandbox.reference_worker import TaskState, scrub_device

    if device.startswith("cuda"):
        if "autotune" in cfg.compile_mode:
            raise ValueError(f"prewarm on {device}: compile_mode {cfg.compile_mode!r} caches autotuning choices "
                             "made beside other GPU work in the compiled graph; only 'default' and "
                             "'reduce-overhead' are prewarmed on a GPU")
        import torch._inductor.config as inductor_config

        inductor_config.autotune_local_cache = False  # the node benchmarks Triton configs under its own lock
    torch.set_num_threads(cfg.cpu_threads)  # as the trusted worker's profile, which compiles the baseline
    t0 = time.monotonic()
    out: list[PrewarmResult] = []
    for task in tasks:
        if not cfg.use_compile or (deadline_s is not None and time.monotonic() - t0 > deadline_s):
            out.append(PrewarmResult(task.id, "skipped"))
            if log is not None:
                log(out[-1])
            continue
        try:
            state = TaskState(task.reference, task.id, device)
            x0 = state.to_device(state.make_inputs(secrets.randbits(62)))
            state.reference_outputs(x0)  # eager first, as the worker (a lazy module initialises before the compile)
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
            log(out[-1])
    return out


def main(argv: list[str] | None = None) -> int:
    """`python -m sandbox.prewarm NODE_YAML TASKS.jsonl [TASKS.jsonl ...] [--device cpu] [--out prewarm.jsonl]`.

    NODE_YAML: the node's config (`sandbox serve`'s; its `sandbox` section is used). Tasks appearing in several
    files are compiled once. Each task's result is appended to --out as one JSON line as soon as it is known (a
    prewarm stopped early keeps what it did), with a line per task on stdout. Exit 0 even when some tasks failed
    (they are in the file); 2 on unreadable input, an unknown device or a compile mode not prewarmed there."""
    from cuda_agent.config import ConfigError, load_config
    from sandbox.service import ServiceConfig
    from tasks.loaders import load_jsonl

    ap = argparse.ArgumentParser(prog="python -m sandbox.prewarm", description=main.__doc__)
    ap.add_argument("node_yaml")
    ap.add_argument("tasks", nargs="+", help="JSONL task files, soonest evaluated first")
    ap.add_argument("--device", default="cpu", help="cpu or cuda:N")
    ap.add_argument("--deadline-s", type=float, default=None, help="start no task after this many seconds")
    ap.add_argument("--nice", type=int, default=0, help="lower this process's CPU priority by this much")
    ap.add_argument("--out", default="", help="JSONL file, one result per task")
    a = ap.parse_args(argv)
    try:
        if a.nice:
            os.nice(a.nice)
        _check_device(a.device)
        cfg = load_config(ServiceConfig, a.node_yaml).sandbox
        seen: set[str] = set()
        tasks = []
        for path in a.tasks:
            for t in load_jsonl(path):
                if t.id not in seen:
                    seen.add(t.id)
                    tasks.append(t)
        sink = open(a.out, "a", encoding="utf-8") if a.out else None
    except (ConfigError, OSError, ValueError) as e:
        print(f"prewarm: {e}", file=sys.stderr)
        return 2

    def report(r: PrewarmResult) -> None:
        print(f"prewarm {r.task_id}: {r.status}" + (f" in {r.compile_s:.1f} s" if r.compile_s else "")
              + (f" ({r.message})" if r.message else ""), flush=True)
        if sink is not None:
            sink.write(json.dumps(dataclasses.asdict(r)) + "\n")
            sink.flush()

    t0 = time.monotonic()
    try:
        res = prewarm_baselines(tasks, cfg, a.device, a.deadline_s, log=report)
    except ValueError as e:
        print(f"prewarm: {e}", file=sys.stderr)
        return 2
    finally:
        if sink is not None:
            sink.close()
    counts: dict[str, int] = {}
    for r in res:
        counts[r.status] = counts.get(r.status, 0) + 1
    print(f"prewarm: {len(res)} task(s) in {time.monotonic() - t0:.1f} s: {counts}", flush=True)
    return 0


def _check_device(device: str) -> None:
    """ValueError unless `device` is "cpu" or "cuda:N" naming a GPU torch sees."""
    import torch

    if device == "cpu":
        return
    if not device.startswith("cuda:") or not device[5:].isdigit():
        raise ValueError(f"--device must be cpu or cuda:N, got {device!r}")
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if int(device[5:]) >= n:
        raise ValueError(f"--device {device}: torch sees {n} GPU(s)")


if __name__ == "__main__":
    sys.exit(main())
