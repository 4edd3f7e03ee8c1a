"""Execution-based filtering of candidate tasks (paper: data synthesis, filtering by execution).

A candidate is kept only if, on the configured device,
  1. it loads and runs in eager mode (static checks, import, build, forward: `tasks.validate`);
  2. two runs from the same seeds give bitwise-identical outputs (deterministic);
  3. its outputs are finite and not degenerate: not all zeros, not constant, not >99% one value, not
     vanishing (max |y| below `min_abs_output`) or exploding (above `max_abs_output`);
  4. nothing in it is dead: every float input and the result of every non-view aten op, perturbed by a small
     relative noise, changes at least `min_live_fraction` of the output elements (an op that makes the rest
     dead - a saturating clamp, a softmax summed to 1 - fails this); for synthesized tasks, also every
     shape-preserving operator, removed from the source, changes the output (no operator without effect);
  5. its eager time (median of timed repetitions after warm-up) lies inside the window (default 1-100 ms on
     CUDA as in the paper, 0.1-20 ms on the CPU backend at `cpu_threads` threads);
  6. it compiles and runs under `torch.compile` with outputs matching eager within the task's tolerances.
Checks run in this order (cheap first); the first failure names the reason (REASONS).

Where it runs: `check_task` is the whole per-task check, a plain function of (task, config). `FilterPool`
runs it in spawned worker processes of our own (one task at a time each, with a per-task wall-clock limit:
the worker's process group is killed on expiry and replaced; a crashed worker yields `worker_crash`). The
sandbox's trusted reference worker (sandbox/reference_worker.py) evaluates candidate *solutions* and has no
entry point for timing a bare reference yet; when it gains one, only `FilterPool` needs to change.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import multiprocessing as mp
import os
import random
import signal
import sys
import time
import traceback
from dataclasses import dataclass, field
from multiprocessing.connection import wait as mp_wait
from typing import Any, Callable, Iterable, Iterator

from tasks.schema import Task

REASONS = {
    # from tasks.validate
    "syntax_error": "does not parse", "no_model": "no Model", "no_get_inputs": "no get_inputs",
    "no_get_init_inputs": "no get_init_inputs", "import_error": "import raised",
    "model_not_module": "Model is not an nn.Module", "init_error": "constructor raised",
    "inputs_error": "get_inputs raised", "forward_error": "eager forward raised",
    "non_tensor_output": "non-tensor output", "empty_output": "empty output",
    "not_deterministic": "not deterministic", "bad_shape_params": "bad shape_params",
    # degenerate outputs
    "nonfinite_output": "NaN or Inf in the output", "zero_output": "output all zeros",
    "constant_output": "constant output", "near_constant_output": ">99% of the output is one value",
    "vanishing_output": "output magnitude below the floor", "exploding_output": "output magnitude above the cap",
    # dead parts
    "input_unused": "an input does not reach the output", "dead_op": "an op's result does not reach the output",
    "no_effect_op": "removing an operator leaves the output unchanged",
    # time window and compile
    "too_fast": "eager time below the window", "too_slow": "eager time above the window",
    "compile_error": "torch.compile failed", "compile_mismatch": "torch.compile output differs from eager",
    # pool and set level
    "timeout": "ran past the per-task limit", "worker_crash": "the worker process died",
    "internal_error": "the filter itself failed",
    "out_of_memory": "the device ran out of memory on every try (other workers share it: not a verdict on the task)",
    "near_duplicate": "near-duplicate of an accepted task",
    "contaminated": "near-duplicate of a benchmark task", "compose_error": "composer found no valid graph",
}

DEFAULT_WINDOWS_MS = {"cpu": (0.1, 20.0), "cuda": (1.0, 100.0)}


@dataclass
class FilterConfig:
    """Settings of the execution-based filter.

    Fields:
      device: "cpu" or "cuda" (the backend the tasks are meant for).
      eager_window_ms: [low, high] eager time window in ms; empty -> DEFAULT_WINDOWS_MS[device].
      cpu_threads: torch intra-op threads in each worker (timings are taken at this count).
      check_compile: run the torch.compile check.
      check_timing: run the eager time-window check.
      check_dead: run the input / op liveness checks.
      warmup: untimed calls before timing.
      min_reps, max_reps: timed repetitions (at least min, at most max, stopping once `timing_budget_s` spent).
      timing_budget_s: time spent on timed repetitions per measured function, seconds.
      min_abs_output, max_abs_output: bounds on max |output| (vanishing / exploding).
      min_live_fraction: share of output elements a perturbation must change for the perturbed part to be live.
      perturb_scale: relative size of the liveness perturbation (per element, of its own magnitude).
      task_timeout_s: wall-clock limit per task in a pool worker, seconds (after the worker's warm-up).
      workers: pool worker processes (with device "cuda", worker i uses GPU i mod the GPU count; workers that share
        a GPU time one at a time under its timing lock, see timing_lock, and share its memory).
      warm_compile: pay the process's first torch.compile (15-18 s on 2 CPU cores) at worker start.
      max_tasks_per_worker: a worker is replaced after this many tasks (bounds leaks of compiled graphs).
      autosize: when a task is too fast, double its shape parameters toward the window's geometric middle
        (estimate from tasks.sizing, calibrated by the measured time) and check it again, up to
        `autosize_rounds` times. On for synthesis; off by default so that `filter` never changes a task.
      autosize_rounds: re-sizing rounds per task.
      timing_lock: device "cuda": time under the GPU's timing lock (sandbox.service_lock, the one the sandbox nodes
        take), holding it shared around the rest of a task's GPU work (let go between steps while a timer waits),
        so that workers sharing a GPU time eager and torch.compile alone. A timing that could not have the lock is
        flagged (Verdict.contended).
      timing_lock_timeout_s: how long a timed section waits for the lock before timing anyway (contended), s (an
        untimed section waits for as long as a timer holds it: it never runs without the lock) (the sandbox node's own timing timeout is 10 s). Lock waits count
        against task_timeout_s.
      timing_lock_dir: the lock files' folder; "" = sandbox.service_lock's default (give the nodes' own when they
        are configured with another).
      oom_retries: a task whose check runs the device out of memory is checked again this many times (after the
        worker empties torch's cache and waits 1-3 s: workers sharing a GPU come and go); then out_of_memory.
      device_memory_fraction: device "cuda", pool only: the share of each GPU's memory that the charges of the
        tasks in flight on it may reach; a task whose charge does not fit waits for one that runs to finish (a
        task is always let in on a GPU with nothing in flight). 0 turns this admission off. Without it, 16
        workers on GPU-sized tasks ran one H200 out of memory on 42 of 94 tasks (benchmarks/RESULTS.md).
      memory_charge_factor: a task's charge is this times its footprint estimate (tasks.sizing.footprint_bytes
        of a meta-device trace: inputs + parameters + the two largest ops), bytes: the checks hold two runs'
        outputs, a perturbed run's and torch.compile's besides (Verdict.peak_device_bytes gives the real peak).
    """

    device: str = "cpu"
    eager_window_ms: list[float] = field(default_factory=list)
    cpu_threads: int = 1
    check_compile: bool = True
    check_timing: bool = True
    check_dead: bool = True
    warmup: int = 2
    min_reps: int = 5
    max_reps: int = 50
    timing_budget_s: float = 0.5
    min_abs_output: float = 1e-5
    max_abs_output: float = 1e6
    min_live_fraction: float = 0.01
    perturb_scale: float = 1e-3
    task_timeout_s: float = 120.0
    workers: int = 2
    warm_compile: bool = True
    max_tasks_per_worker: int = 400
    autosize: bool = False
    autosize_rounds: int = 3
    timing_lock: bool = True
    timing_lock_timeout_s: float = 10.0
    timing_lock_dir: str = ""
    oom_retries: int = 2
    device_memory_fraction: float = 0.85
    memory_charge_factor: float = 2.0

    def __post_init__(self) -> None:
        if self.device not in DEFAULT_WINDOWS_MS:
            raise ValueError(f"device must be one of {sorted(DEFAULT_WINDOWS_MS)}, got {self.device!r}")
        if not self.eager_window_ms:
            self.eager_window_ms = list(DEFAULT_WINDOWS_MS[self.device])
        lo, hi = self.eager_window_ms
        if not 0 <= lo < hi:
            raise ValueError(f"eager_window_ms must be [low, high] with 0 <= low < high, got {self.eager_window_ms}")
        for name in ("cpu_threads", "workers", "min_reps", "max_reps", "max_tasks_per_worker"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_reps < self.min_reps:
            raise ValueError(f"max_reps ({self.max_reps}) must be >= min_reps ({self.min_reps})")
        if self.task_timeout_s <= 0:
            raise ValueError(f"task_timeout_s must be > 0, got {self.task_timeout_s}")
        if self.timing_lock_timeout_s < 0 or self.oom_retries < 0:
            raise ValueError(f"timing_lock_timeout_s and oom_retries must be >= 0, got {self.timing_lock_timeout_s}"
                             f" and {self.oom_retries}")
        if not 0 <= self.device_memory_fraction <= 1 or self.memory_charge_factor <= 0:
            raise ValueError(f"device_memory_fraction must be in [0, 1] and memory_charge_factor > 0, got "
                             f"{self.device_memory_fraction} and {self.memory_charge_factor}")

    @property
    def window(self) -> tuple[float, float]:
        return float(self.eager_window_ms[0]), float(self.eager_window_ms[1])


@dataclass
class Verdict:
    """The filter's decision on one task.

    Fields:
      task_id: the task.
      accepted: kept or not.
      reason: "" when accepted, else a key of REASONS.
      detail: what exactly failed (exception, offending op, measured time...).
      eager_ms, compile_ms: median times of one call (None when not measured).
      signature: normalised operator sequence (tasks.trace), for near-duplicate checks.
      output_shapes: shapes of the output leaves.
      flops, bytes: from the meta-device trace.
      check_s: wall time of the whole check, seconds.
      resized_params: the shape parameters the task was accepted at, when autosize changed them (else {}).
      device_name: the device the checks ran on ("cpu" or the CUDA device's name).
      contended: a timing of this check ran without the GPU's timing lock (FilterConfig.timing_lock).
      oom_retries: times the check was run again after the device ran out of memory.
      lock_wait_s: time spent waiting for the GPU's timing lock (shared and exclusive sections), seconds, over every
        attempt of the check (out-of-memory retries and autosize rounds included, as check_s).
      footprint_bytes: the forward's footprint estimate at the checked sizes (tasks.sizing.footprint_bytes), bytes;
        recorded in an accepted task's metadata, where the pool's memory admission reads it.
      peak_device_bytes: device "cuda": the most device memory torch's allocator held for the check at once, bytes
        (torch.cuda.max_memory_allocated over every attempt; 0 on the CPU).
    """

    task_id: str
    accepted: bool
    reason: str = ""
    detail: str = ""
    eager_ms: float | None = None
    compile_ms: float | None = None
    signature: list[str] = field(default_factory=list)
    output_shapes: list[list[int]] = field(default_factory=list)
    flops: int = 0
    bytes: int = 0
    check_s: float = 0.0
    resized_params: dict[str, int] = field(default_factory=dict)
    device_name: str = ""
    contended: bool = False
    oom_retries: int = 0
    lock_wait_s: float = 0.0
    footprint_bytes: int = 0
    peak_device_bytes: int = 0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Verdict":
        return cls(**d)


class _Reject(Exception):
    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail = reason, detail


# ------------------------------------------------------------------------------------------------ the checks


def _float_leaves(outs: list) -> list:
    return [o for o in outs if o.is_floating_point() or o.is_complex()]


def _check_outputs(outs: list, cfg: FilterConfig) -> None:
    import torch

    for i, o in enumerate(outs):
        where = f"output {i} {list(o.shape)}"
        if o.is_floating_point() and not bool(torch.isfinite(o).all()):
            n = int((~torch.isfinite(o)).sum())
            raise _Reject("nonfinite_output", f"{where}: {n} of {o.numel()} elements are NaN/Inf")
        if not bool(o.ne(0).any()):
            raise _Reject("zero_output", where)
        flat = o.reshape(-1)
        if flat.numel() > 1 and bool((flat == flat[0]).all()):
            raise _Reject("constant_output", f"{where}: every element is {flat[0].item():.4g}")
        if flat.numel() >= 100:
            _, counts = torch.unique(flat, return_counts=True)
            top = int(counts.max())
            if top > 0.99 * flat.numel():
                raise _Reject("near_constant_output", f"{where}: {top} of {flat.numel()} elements share one value")
        if o.is_floating_point():
            m = float(o.abs().max())
            if m < cfg.min_abs_output:
                raise _Reject("vanishing_output", f"{where}: max |y| = {m:.3g} < {cfg.min_abs_output:g}")
            if m > cfg.max_abs_output:
                raise _Reject("exploding_output", f"{where}: max |y| = {m:.3g} > {cfg.max_abs_output:g}")


def _changed_fraction(base: list, new: list) -> float:
    """Largest share of elements that differ bitwise, over the float outputs."""
    best = 0.0
    for a, b in zip(base, new):
        if a.shape != b.shape:
            return 1.0
        if a.is_floating_point():
            diff = (a != b) & ~(a.isnan() & b.isnan())
            best = max(best, float(diff.float().mean()))
    return best


def _noise_like(t, scale: float, gen):
    """t + noise, each element moved by about `scale` of its own magnitude (plus a small floor for zeros); the
    noise is drawn by `gen` on its device (t's)."""
    import torch

    mag = float(t.abs().mean()) if t.numel() else 0.0
    noise = torch.randn(t.shape, generator=gen, dtype=t.dtype, device=gen.device).to(t.device)
    floor = 1e-3 * scale * (mag if mag > 0 else 1.0)  # an all-zero tensor (a bias at init) still moves
    return t + noise * (scale * t.abs() + floor)


def _perturbed_forward(model, inputs, target: int, scale: float):
    """Forward with the result of the `target`-th countable aten op perturbed; returns (outputs, op count/name)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_map

    from tasks.reference import flatten_outputs
    from tasks.trace import IGNORED_OPS

    gens: dict = {}  # seeded per device, as in _check_liveness
    state = {"i": -1, "name": ""}

    def noise(t):
        if t.device not in gens:
            gens[t.device] = torch.Generator(device=t.device).manual_seed(1234 + target)
        return _noise_like(t, scale, gens[t.device])

    class _Perturb(TorchDispatchMode):
        def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func.is_view or func._schema.is_mutable or func.overloadpacket.__name__ in IGNORED_OPS:
                return out
            has_float = any(isinstance(t, torch.Tensor) and t.is_floating_point()
                            for t in (out if isinstance(out, (tuple, list)) else [out]))
            if not has_float:
                return out
            state["i"] += 1
            if state["i"] == target:
                state["name"] = func.overloadpacket.__name__
                return tree_map(lambda t: noise(t) if isinstance(t, torch.Tensor) and t.is_floating_point() else t,
                                out)
            return out

    with torch.no_grad(), _Perturb():
        outs = flatten_outputs(model(*inputs))
    return outs, state["i"] + 1, state["name"]


def _no_pause() -> None:
    pass


def _check_liveness(model, inputs, base: list, cfg: FilterConfig, pause: Callable[[], None] = _no_pause) -> None:
    """pause(): called between forwards (the GPU's timing lock let go while a timer waits, _SharedGpu.pause)."""
    import torch

    from tasks.reference import run_reference

    gens: dict = {}  # one seeded generator per device: CUDA inputs get their noise drawn on the device
    for i, x in enumerate(inputs):
        pause()
        if isinstance(x, torch.Tensor) and x.is_floating_point():
            if x.device not in gens:
                gens[x.device] = torch.Generator(device=x.device).manual_seed(99)
            moved = list(inputs)
            moved[i] = _noise_like(x, cfg.perturb_scale, gens[x.device])
            frac = _changed_fraction(base, run_reference(model, moved))
            if frac < cfg.min_live_fraction:
                raise _Reject("input_unused", f"perturbing input {i} changes {frac:.2%} of the output")
    _, n_ops, _ = _perturbed_forward(model, inputs, -1, cfg.perturb_scale)
    for k in range(n_ops):
        pause()
        outs, _, name = _perturbed_forward(model, inputs, k, cfg.perturb_scale)
        frac = _changed_fraction(base, outs)
        if frac < cfg.min_live_fraction:
            raise _Reject("dead_op", f"perturbing the result of aten.{name} (op #{k}) changes {frac:.2%} of the output")


def _check_no_effect(task: Task, base: list, cfg: FilterConfig, device: str | None,
                     pause: Callable[[], None] = _no_pause) -> None:
    """Synthesized tasks record each operator's source lines: drop each shape-preserving one in turn (pause():
    as in _check_liveness)."""
    from tasks.validate import TaskValidationError, build_and_run, load_checked

    spans = task.metadata.get("op_lines")
    keep = task.metadata.get("op_preserves_shape")
    if not spans or not keep:
        return
    lines = task.reference.splitlines(keepends=True)
    for j, ((first, last), preserves) in enumerate(zip(spans, keep)):
        if not preserves:
            continue
        pause()
        variant = "".join(lines[: first - 1] + lines[last:])
        try:
            mod = load_checked(variant, f"<{task.id} without op {j}>")
            _, _, outs = build_and_run(mod, f"<{task.id} without op {j}>", seed=0, device=device,
                                       raise_oom=device == "cuda", on_device=True)
        except TaskValidationError:
            continue  # removing it breaks the program: it has an effect
        if _changed_fraction(base, outs) == 0.0 and len(outs) == len(base):
            name = task.operators[j] if j < len(task.operators) else f"#{j}"
            raise _Reject("no_effect_op", f"removing operator {name} (#{j}) leaves the output unchanged")


def _sync(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def time_call_ms(fn, device: str, cfg: FilterConfig, stop_above_ms: float | None = None) -> float:
    """Median wall time of one call in ms: `warmup` calls, then timed repetitions with full synchronisation.

    Stops early (returning the first measurement) when one call already exceeds `stop_above_ms`.
    """
    import statistics

    for _ in range(cfg.warmup):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        first = (time.perf_counter() - t0) * 1e3
        if stop_above_ms is not None and first > stop_above_ms:
            return first
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < cfg.max_reps and (len(times) < cfg.min_reps or time.perf_counter() - start < cfg.timing_budget_s):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _allclose(a: list, b: list, atol: float, rtol: float) -> tuple[bool, str]:
    import torch

    if len(a) != len(b):
        return False, f"{len(b)} outputs instead of {len(a)}"
    for i, (x, y) in enumerate(zip(a, b)):
        if x.shape != y.shape:
            return False, f"output {i}: shape {list(y.shape)} instead of {list(x.shape)}"
        if not torch.allclose(x.double(), y.double().to(x.device), atol=atol, rtol=rtol, equal_nan=True):
            err = float((x.double() - y.double().to(x.device)).abs().max())
            return False, f"output {i}: max abs difference {err:.3g} (atol {atol:g}, rtol {rtol:g})"
    return True, ""


def resized(task: Task, params: dict[str, int]) -> Task:
    """The task with new shape-parameter values written into its reference."""
    from tasks.reference import with_shape_params

    new = {**task.shape_params, **params}
    return task.replace(reference=with_shape_params(task.reference, params, task.id), shape_params=new)


def check_task(task: Task, cfg: FilterConfig) -> Verdict:
    """Run every filter check on one task in this process (see the module docstring). Never raises.

    With `cfg.autosize`, a too-fast task is re-sized toward the window's geometric middle and checked again
    (a re-sized task that lands above the window is re-sized toward a lower target); the verdict's
    `resized_params` then holds the sizes it was accepted (or finally rejected) at.
    """
    t_start = time.perf_counter()
    current = task
    rounds = 0
    lo, hi = cfg.window
    target = math.sqrt(lo * hi)
    base_ms: float | None = None
    tried = [dict(task.shape_params)]
    lock_wait_s = 0.0  # over every attempt; each attempt's Verdict starts from 0
    if cfg.device == "cuda":
        import torch

        torch.cuda.reset_peak_memory_stats()
    while True:
        # a device out-of-memory error is checked again (an autosize round's is the size's fault: no retry)
        retries = cfg.oom_retries if cfg.device == "cuda" and rounds == 0 else 0
        for attempt in range(retries + 1):
            v = Verdict(task_id=task.id, accepted=False, oom_retries=attempt)
            oom = False
            try:
                _check_task(current, cfg, v)
                v.accepted = True
            except _Reject as r:
                v.reason, v.detail = r.reason, r.detail[:500]
            except Exception as e:  # noqa: BLE001 - a filter bug must not take the pool down
                oom = cfg.device == "cuda" and _is_oom(e)
                v.reason = "out_of_memory" if oom else "internal_error"
                v.detail = _describe(e, with_traceback=not oom)
            lock_wait_s += v.lock_wait_s
            # out of the except clause: its traceback (and the task's tensors in its frames) is gone, so the
            # cache can go back to the GPU while this worker waits
            if oom:
                _release_device_memory(cfg.device)
                if attempt < retries:
                    time.sleep(random.uniform(1.0, 3.0))
                    continue
            break
        if rounds == 0 and v.reason == "too_fast":
            base_ms = v.eager_ms
        # a re-sized task that ran the GPU out of memory is too big: re-sized toward a lower target, as a slow one
        wants = (v.reason == "too_fast" or (v.reason in ("too_slow", "out_of_memory") and rounds > 0))
        if cfg.autosize and task.shape_params and base_ms and wants and rounds < cfg.autosize_rounds:
            if v.reason in ("too_slow", "out_of_memory"):
                target /= 4
            try:
                from tasks.sizing import CPU_CORE, H200, resize_for_target

                params, _ = resize_for_target(task.reference, task.shape_params, target,
                                              CPU_CORE if cfg.device == "cpu" else H200, task.id, base_ms=base_ms)
            except Exception as e:  # noqa: BLE001
                v.detail += f"; resizing failed: {type(e).__name__}: {e}"
                params = tried[-1]
            if params not in tried:
                tried.append(params)
                rounds += 1
                current = resized(task, params)
                continue
        break
    if current is not task:
        v.resized_params = dict(current.shape_params)
    if rounds and not v.accepted:
        v.detail += f" (after {rounds} resizing round(s))"
    v.check_s = time.perf_counter() - t_start
    v.lock_wait_s = lock_wait_s
    v.device_name = _device_name(cfg.device)
    if cfg.device == "cuda":
        import torch

        v.peak_device_bytes = int(torch.cuda.max_memory_allocated())
    return v


def _is_oom(e: BaseException) -> bool:
    """A device out-of-memory error: torch.OutOfMemoryError or a torch.AcceleratorError saying "out of memory", also
    as the cause of another (torch.compile wraps it in BackendCompilerFailed, whose `inner_exception` it is). A
    task that exhausts host memory is its own fault."""
    import torch

    seen: set[int] = set()
    todo: list = [e]
    while todo:
        x = todo.pop()
        if x is None or id(x) in seen or len(seen) > 16:
            continue
        seen.add(id(x))
        if isinstance(x, torch.OutOfMemoryError):
            return True
        # a CUDA call (not the caching allocator) that found the device's memory taken, e.g. a library's workspace:
        # "CUDA error: out of memory" as torch.AcceleratorError (seen on the H200 with 16 workers on one GPU)
        accel = getattr(torch, "AcceleratorError", None)
        if accel is not None and isinstance(x, accel) and "out of memory" in _describe(x, with_traceback=False):
            return True
        inner = getattr(x, "inner_exception", None)
        todo += [x.__cause__, x.__context__, inner if isinstance(inner, BaseException) else None]
    return False


def _describe(e: BaseException, with_traceback: bool) -> str:
    """'Type: message' (and the traceback's end), even for an exception whose __str__ raises (task code's own)."""
    try:
        text = f"{type(e).__name__}: {str(e)[:400]}"
    except Exception:  # noqa: BLE001
        text = f"{type(e).__name__}: (its message could not be read)"
    if with_traceback:
        try:
            text += "\n" + traceback.format_exc()[-800:]
        except Exception:  # noqa: BLE001
            pass
    return text


def _release_device_memory(device: str) -> None:
    """Return torch's cached device blocks (a worker between tasks holds nothing else), so that the other
    workers on the GPU can have them."""
    if device == "cuda":
        import gc

        import torch

        gc.collect()
        torch.cuda.empty_cache()


_LOCKS: dict[tuple[int, str], Any] = {}  # (CUDA ordinal, lock folder)
_LOCK_WARNED: set[str] = set()


def _warn_lock(lock: Any, e: OSError) -> None:
    """Once per lock and process: its files could not be opened, so neither this worker's timings nor the sandbox
    nodes' are protected from each other (run the filter as the nodes' user, or give it their lock folder)."""
    if lock.key not in _LOCK_WARNED:
        _LOCK_WARNED.add(lock.key)
        print(f"tasks.filtering: cannot open the timing lock {lock.dir}/{lock.key}.*: {e}; timing without it "
              "(verdicts flagged contended)", file=sys.stderr, flush=True)


def _device_lock(cfg: FilterConfig) -> Any:
    """The timing lock of this worker's GPU (sandbox.service_lock.DeviceTimingLock), or None (CPU, or off)."""
    if cfg.device != "cuda" or not cfg.timing_lock:
        return None
    import torch

    from sandbox.service_lock import DeviceTimingLock, visible_gpu_key

    key = (torch.cuda.current_device(), cfg.timing_lock_dir)
    if key not in _LOCKS:
        _LOCKS[key] = DeviceTimingLock(visible_gpu_key(key[0]),
                                       **({"lock_dir": cfg.timing_lock_dir} if cfg.timing_lock_dir else {}))
    return _LOCKS[key]


def _device_name(device: str) -> str:
    if device != "cuda":
        return "cpu"
    import torch

    return torch.cuda.get_device_name(torch.cuda.current_device())


def _check_task(task: Task, cfg: FilterConfig, v: Verdict) -> None:
    import torch

    from tasks.reference import run_reference
    from tasks.trace import trace_module
    from tasks.validate import TaskValidationError, build_and_run, load_checked, origin_of, outputs_equal

    device = cfg.device
    origin = origin_of(task)
    lock = _device_lock(cfg)
    oom_raises = device == "cuda"  # a device OOM is not the task's fault (check_task checks it again)
    # the GPU work but the timed sections runs holding the GPU's timing lock shared (a timer waits for it)
    with _SharedGpu(lock, cfg, v) as share:
        try:
            mod = load_checked(task.reference, origin)
            model, inputs, out1 = build_and_run(mod, origin, seed=0, device=device, raise_oom=oom_raises,
                                                on_device=True)
            share.pause()
            _, _, out2 = build_and_run(mod, origin, seed=0, device=device, raise_oom=oom_raises, on_device=True)
        except TaskValidationError as e:
            raise _Reject(e.problem, e.detail) from None
        share.pause()
        v.output_shapes = [list(o.shape) for o in out1]
        same, worst = outputs_equal(out1, out2)
        if not same:
            raise _Reject("not_deterministic", f"max abs difference {worst:.3g} between two runs")
        try:
            tr = trace_module(mod, device="meta")
            v.signature, v.flops, v.bytes = list(tr.signature), tr.total_flops, tr.total_bytes
        except Exception:  # data-dependent references do not trace on meta tensors: trace the real run
            tr = trace_module(mod, device=device)
            v.signature, v.flops, v.bytes = list(tr.signature), tr.total_flops, tr.total_bytes
        from tasks.sizing import footprint_bytes

        v.footprint_bytes = footprint_bytes(tr)
        share.pause()
        _check_outputs(out1, cfg)
        if cfg.check_dead:
            _check_liveness(model, inputs, out1, cfg, share.pause)
            _check_no_effect(task, out1, cfg, device, share.pause)
    lo, hi = cfg.window
    with torch.no_grad():
        if cfg.check_timing:
            v.eager_ms = _timed_ms(lock, v, lambda: model(*inputs), device, cfg, stop_above_ms=3 * hi)
            if v.eager_ms < lo:
                raise _Reject("too_fast", f"eager {v.eager_ms:.3g} ms < {lo:g} ms")
            if v.eager_ms > hi:
                raise _Reject("too_slow", f"eager {v.eager_ms:.3g} ms > {hi:g} ms")
        if cfg.check_compile:
            # the first call compiles under the shared lock: besides the CPU work (Dynamo, Inductor, Triton) it
            # benchmarks the configurations of Inductor's kernels on the GPU (pointwise and reduction autotuning, tens
            # of ms each), which would disturb another user's timing; a timer waits for it (at most
            # timing_lock_timeout_s, then its timing is flagged contended)
            with _SharedGpu(lock, cfg, v):
                try:
                    compiled = torch.compile(model)
                    outc = run_reference(compiled, inputs)
                except Exception as e:  # noqa: BLE001
                    if oom_raises and _is_oom(e):
                        raise
                    msg = str(e).strip().splitlines()
                    raise _Reject("compile_error", f"{type(e).__name__}: {msg[0][:300] if msg else ''}") from None
                ok, why = _allclose(out1, outc, task.atol, task.rtol)
            if not ok:
                raise _Reject("compile_mismatch", why)
            if cfg.check_timing:
                v.compile_ms = _timed_ms(lock, v, lambda: compiled(*inputs), device, cfg)


class _SharedGpu:
    """The GPU's timing lock held shared over a task's untimed GPU work (a context manager over
    sandbox.service_lock.SharedUse, waiting as long as a timer holds it), or nothing: CPU, lock off, or lock files
    this user may not open (warned once). `pause()`, between two forwards: while a timer waits for the lock, it is let go and taken again, so a
    sandbox node on the same GPU waits for one forward of the filter's, not for its whole pass. The waits are
    added to the verdict's lock_wait_s."""

    def __init__(self, lock: Any, cfg: FilterConfig, v: Verdict):
        from sandbox.service_lock import SharedUse

        self.v = v
        # no timeout: untimed GPU work never runs without the lock, where a timer that got it would time beside it
        # unflagged (the wait counts against task_timeout_s)
        self.use = SharedUse(lock, None) if lock is not None else None

    def __enter__(self) -> "_SharedGpu":
        if self.use is not None:
            try:
                self.use.__enter__()
            except OSError as e:  # e.g. the lock folder belongs to another user (sandbox nodes under their own uid)
                _warn_lock(self.use.lock, e)
                self.use = None
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.use is not None:
            self.use.__exit__(*exc)
            self.v.lock_wait_s += self.use.wait_s

    def pause(self) -> None:
        if self.use is not None:
            self.use.pause()


def _timed_ms(lock: Any, v: Verdict, fn: Any, device: str, cfg: FilterConfig,
              stop_above_ms: float | None = None) -> float:
    """time_call_ms under the GPU's timing lock held exclusively (v.contended when it could not be had, or its
    files could not be opened)."""
    with contextlib.ExitStack() as section:
        if lock is not None:
            try:
                state = section.enter_context(lock.timing(cfg.timing_lock_timeout_s))
                v.contended = v.contended or not state.acquired
                v.lock_wait_s += state.wait_ms / 1e3
            except OSError as e:
                _warn_lock(lock, e)
                v.contended = True
        return time_call_ms(fn, device, cfg, stop_above_ms)


# -------------------------------------------------------------------------------------------------- the pool


def _worker_main(conn, cfg_dict: dict, slot: int = 0) -> None:
    """Worker process: own process group, one torch thread pool, optional compile warm-up, then serve tasks.

    Each worker slot gets its own inductor cache folder: two workers compiling the same graph at the same
    time into one shared cache can read each other's half-written libraries ("file too short").
    """
    try:
        os.setsid()
    except OSError:
        pass
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
        import getpass
        import tempfile

        os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(
            tempfile.gettempdir(), f"torchinductor_{getpass.getuser()}", f"filter_worker{slot}")
    cfg = FilterConfig(**cfg_dict)
    import torch

    torch.set_num_threads(cfg.cpu_threads)
    ready: dict[str, Any] = {"pid": os.getpid(), "gpu": -1, "memory_bytes": 0}
    if cfg.device == "cuda":  # workers beyond the GPU count share a GPU (timing lock, memory admission)
        ready["gpu"] = slot % torch.cuda.device_count()
        torch.cuda.set_device(ready["gpu"])
        ready["memory_bytes"] = int(torch.cuda.get_device_properties(ready["gpu"]).total_memory)
    if cfg.warm_compile and cfg.check_compile:
        try:
            f = torch.compile(lambda a: torch.relu(a) * 2 + 1)
            f(torch.randn(8, device=cfg.device))
            torch._dynamo.reset()
        except Exception:  # noqa: BLE001 - the real check will report it per task
            pass
    conn.send(("ready", ready))
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            return
        task = Task.from_dict(msg)
        verdict = check_task(task, cfg)
        conn.send(("verdict", verdict.to_dict()))
        try:
            torch._dynamo.reset()
        except Exception:  # noqa: BLE001
            pass
        # the task's tensors are gone: torch's cached blocks go back to the GPU, for the other workers on it (with
        # 16 workers on one H200, 138 of 199 candidates ended in forward or internal errors; causes not yet seen)
        _release_device_memory(cfg.device)


@dataclass
class _Slot:
    proc: Any
    conn: Any
    ready: bool = False
    task: Task | None = None
    deadline: float = 0.0
    done: int = 0
    started: float = 0.0
    gpu: int = -1  # CUDA ordinal of the worker's GPU (-1: CPU)
    memory_bytes: int = 0  # that GPU's total memory
    charge: int = 0  # memory charge of the task it runs, bytes


def memory_charge_bytes(task: Task, cfg: FilterConfig) -> int:
    """Device memory a task's check is charged in the pool's admission, bytes: FilterConfig.memory_charge_factor
    times the task's recorded footprint (metadata "footprint_bytes", tasks.sizing.footprint_bytes: the built-in
    GPU split and every task this filter accepted on a GPU carry it). 0 for a task without one (it is let in and
    relies on oom_retries): the pool never runs task code itself, so it does not trace it."""
    try:
        return max(0, int(cfg.memory_charge_factor * float(task.metadata.get("footprint_bytes") or 0)))
    except (TypeError, ValueError):
        return 0


class FilterPool:
    """Spawned worker processes running `check_task`, one task each at a time, with per-task time limits.

    Use as a context manager. Workers are started with the "spawn" method, so a script using the pool needs
    the usual `if __name__ == "__main__":` guard. `poll` raises RuntimeError when workers die while starting
    `max_start_failures` times in a row (a broken environment, not a task). `submit(task)` queues; `poll(timeout_s)` returns the (task, verdict) pairs that
    finished; `pending` counts queued plus running tasks. Workers are started lazily and replaced after a
    timeout (their process group is killed), a crash, or `max_tasks_per_worker` tasks.
    """

    def __init__(self, cfg: FilterConfig, start_timeout_s: float = 300.0, max_start_failures: int = 3):
        self.cfg = cfg
        self.start_timeout_s = start_timeout_s
        self.max_start_failures = max_start_failures
        self._start_failures = 0
        self._ctx = mp.get_context("spawn")
        self._slots: list[_Slot] = []
        self._queue: list[Task] = []
        self._head_skips = 0  # times the queue's head was passed over for lack of memory
        self.admission_waits = 0  # dispatch rounds in which a free worker held back for lack of device memory

    def __enter__(self) -> "FilterPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def pending(self) -> int:
        return len(self._queue) + sum(1 for s in self._slots if s.task is not None)

    def _spawn(self, slot: int) -> _Slot:
        parent, child = self._ctx.Pipe()
        p = self._ctx.Process(target=_worker_main, args=(child, dataclasses.asdict(self.cfg), slot), daemon=True)
        p.start()
        child.close()
        return _Slot(proc=p, conn=parent, started=time.monotonic())

    def _kill(self, s: _Slot) -> None:
        try:
            os.killpg(s.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError, OSError):
            pass
        try:
            s.proc.kill()
        except Exception:  # noqa: BLE001
            pass
        s.proc.join(timeout=5)
        try:
            s.conn.close()
        except OSError:
            pass

    def _replace(self, i: int) -> None:
        self._kill(self._slots[i])
        self._slots[i] = self._spawn(i)

    def submit(self, task: Task) -> None:
        self._queue.append(task)
        while len(self._slots) < min(self.cfg.workers, self.pending):
            self._slots.append(self._spawn(len(self._slots)))

    def _admit(self, s: _Slot) -> int | None:
        """Index in the queue of the first task that fits in what s's GPU has left (FilterConfig.
        device_memory_fraction), or None. Tasks behind the head may pass it while it does not fit, until it has
        been passed over 2 x workers times; then only the head may go (it is not starved by smaller tasks)."""
        if s.gpu < 0 or self.cfg.device_memory_fraction <= 0 or not s.memory_bytes:
            return 0
        in_flight = [o.charge for o in self._slots if o.task is not None and o.gpu == s.gpu]
        room = self.cfg.device_memory_fraction * s.memory_bytes - sum(in_flight)
        limit = 1 if self._head_skips >= 2 * self.cfg.workers else len(self._queue)
        for i, task in enumerate(self._queue[:limit]):
            if memory_charge_bytes(task, self.cfg) <= room or not in_flight:
                self._head_skips = 0 if i == 0 else self._head_skips + 1
                return i
        self.admission_waits += 1
        return None

    def _dispatch(self) -> None:
        for s in self._slots:
            if s.ready and s.task is None and self._queue:
                i = self._admit(s)
                if i is None:
                    continue
                s.task = self._queue.pop(i)
                s.charge = memory_charge_bytes(s.task, self.cfg)
                s.deadline = time.monotonic() + self.cfg.task_timeout_s
                s.conn.send(s.task.to_dict())

    def poll(self, timeout_s: float = 1.0) -> list[tuple[Task, Verdict]]:
        """Wait up to `timeout_s` for results; returns those that arrived (possibly none)."""
        self._dispatch()
        done: list[tuple[Task, Verdict]] = []
        if not self._slots:
            return done
        now = time.monotonic()
        deadlines = [s.deadline for s in self._slots if s.task is not None]
        wait_s = max(0.0, min([timeout_s] + [d - now for d in deadlines]))
        ready = mp_wait([s.conn for s in self._slots] + [s.proc.sentinel for s in self._slots], timeout=wait_s)
        for i, s in enumerate(list(self._slots)):
            got_msg = s.conn in ready
            if got_msg:
                try:
                    kind, payload = s.conn.recv()
                except (EOFError, OSError):
                    got_msg = False
                else:
                    if kind == "ready":
                        s.ready = True
                        s.gpu, s.memory_bytes = int(payload["gpu"]), int(payload["memory_bytes"])
                        self._start_failures = 0
                    elif kind == "verdict" and s.task is not None:
                        done.append((s.task, Verdict.from_dict(payload)))
                        s.task, s.charge = None, 0
                        s.done += 1
                        if s.done >= self.cfg.max_tasks_per_worker:
                            self._replace(i)
                    continue
            if not s.proc.is_alive() or (s.proc.sentinel in ready and not got_msg):
                if not s.ready:
                    self._start_failures += 1
                    if self._start_failures >= self.max_start_failures:
                        code = s.proc.exitcode
                        self.close()
                        raise RuntimeError(f"filter workers die while starting (exit code {code}, "
                                           f"{self._start_failures} times in a row); see their stderr")
                if s.task is not None:
                    code = s.proc.exitcode
                    done.append((s.task, Verdict(s.task.id, False, "worker_crash",
                                                 f"worker exited with code {code}")))
                self._replace(i)
            elif s.task is not None and time.monotonic() > s.deadline:
                done.append((s.task, Verdict(s.task.id, False, "timeout",
                                             f"no verdict within {self.cfg.task_timeout_s:g} s")))
                self._replace(i)
            elif not s.ready and time.monotonic() - s.started > self.start_timeout_s:
                self._replace(i)
        self._dispatch()
        return done

    def close(self) -> None:
        for s in self._slots:
            try:
                s.conn.send(None)
            except (OSError, BrokenPipeError):
                pass
        for s in self._slots:
            s.proc.join(timeout=2)
            if s.proc.is_alive():
                self._kill(s)
        self._slots = []

    def map(self, tasks: Iterable[Task]) -> Iterator[tuple[Task, Verdict]]:
        """Filter every task; yields (task, verdict) in completion order."""
        n = 0
        for t in tasks:
            self.submit(t)
            n += 1
        got = 0
        while got < n:
            for pair in self.poll(1.0):
                got += 1
                yield pair


def filter_in_process(tasks: Iterable[Task], cfg: FilterConfig) -> list[tuple[Task, Verdict]]:
    """`check_task` on each task in this process, no time limit (tests and debugging)."""
    import torch

    torch.set_num_threads(cfg.cpu_threads)
    return [(t, check_task(t, cfg)) for t in tasks]


def accepted_task(task: Task, v: Verdict, cfg: FilterConfig) -> Task:
    """The task with the filter's measurements recorded in its metadata."""
    if v.resized_params:
        meta_task = resized(task, v.resized_params)
        task = meta_task.replace(metadata={**meta_task.metadata, "autosized_from": dict(task.shape_params)})
    meta = dict(task.metadata)
    meta.update(signature=v.signature, output_shapes=v.output_shapes, flops=v.flops, bytes=v.bytes,
                filter_device=cfg.device, filter_threads=cfg.cpu_threads)
    if v.footprint_bytes:
        meta["footprint_bytes"] = v.footprint_bytes
    if v.peak_device_bytes:
        meta["filter_peak_device_bytes"] = v.peak_device_bytes
    if v.eager_ms is not None:
        meta["eager_ms"] = round(v.eager_ms, 4)
    if v.compile_ms is not None:
        meta["compile_ms"] = round(v.compile_ms, 4)
    if cfg.device == "cuda" and v.eager_ms is not None:  # a GPU-sized task measured on its GPU
        meta.update(gpu_timing_status="contended" if v.contended else "measured", gpu_name=v.device_name,
                    eager_ms_source="measured")
    return task.replace(metadata=meta)


