"""Demonstrations: correct solutions of training tasks, in the cpu and cubin formats, two variants of
different speed each. They feed the supervised warm start of small models (stage 0) and the sandbox's tests.

    from tasks.demos import demonstrations
    for demo in demonstrations(task):          # [] when no generator covers the task
        demo.files                             # {"model_new.py": ..., "kernels/...": ...}

Where they come from (plain function calls, chosen in `demonstrations`):
  - the fused family (tasks.demos.ir + tasks.demos.codegen): pointwise chains with an optional row reduction /
    normalisation, scan or matrix product, variants "naive" and "fused", and "compact" (tasks.demos.compact:
    short solutions on the sandbox's helper header that mirror the reference line by line, for small models);
  - hand-written generators for conv2d, 2x2 pooling, RMSNorm and the MSE loss (tasks.demos.handwritten),
    variants "naive" and "fast".
The shipped set is `tasks/builtin/demos.jsonl` (built by `python -m tasks.demos.build`); never for an eval task.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tasks.schema import Task

FORMATS = ("cpu", "cubin")


@dataclass
class Demo:
    """One demonstration.

    Fields:
      task_id: the task it solves.
      format: "cpu" or "cubin" (sandbox/FORMATS.md).
      variant: "naive" (slower) or "fused" / "fast" (faster), or "compact" (shortest; tasks.demos.compact).
      family: which generator made it ("pointwise", "row", "scan", "gemm", "conv2d", "pool2d", ...).
      files: the solution, {workspace-relative path: text}.
      notes: one line on how it works (for training text).
    """

    task_id: str
    format: str
    variant: str
    family: str
    files: dict[str, str] = field(default_factory=dict)
    notes: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"task_id": self.task_id, "format": self.format, "variant": self.variant, "family": self.family,
                "files": dict(self.files), "notes": self.notes}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Demo":
        return cls(**d)


_NOTES = {
    ("pointwise", "naive"): "one kernel per statement with an intermediate tensor each (as many passes as eager)",
    ("pointwise", "fused"): "the whole elementwise chain in one pass over memory",
    ("row", "naive"): "one kernel per pointwise statement, then a plain per-row loop for the row operation",
    ("row", "fused"): "pointwise prologue, row operation and epilogue in one kernel, one row per thread/block",
    ("scan", "naive"): "pointwise statements as separate kernels, then a sequential scan per row",
    ("scan", "fused"): "prologue, scan and epilogue in one kernel (cubin: two-level block scan)",
    ("gemm", "naive"): "triple-loop matrix product (cubin: one thread per output), pointwise steps apart",
    ("gemm", "fused"): "cache-friendly matrix product (cubin: 16x16 shared-memory tiles), bias and epilogue at the store",
    ("conv2d", "naive"): "direct convolution with a bounds check per tap (cubin: one thread per output plane)",
    ("conv2d", "fast"): "tap-by-tap accumulation over valid ranges, vectorised inner loop (cubin: one thread per output)",
    ("pool2d", "naive"): "generic window loop with bounds checks (cubin: one thread per plane)",
    ("pool2d", "fast"): "two rows at a time, window unrolled (cubin: one thread per output)",
}


def _handwritten(task: Task):
    from tasks.demos import handwritten as hw

    name = task.id
    if name == "op_conv2d":
        return "conv2d", hw.conv2d, ("naive", "fast")
    if name in ("op_maxpool2d", "op_avgpool2d"):
        return "pool2d", hw.pool2d, ("naive", "fast")
    if name == "op_rmsnorm":
        return "row", hw.rms_norm, ("naive", "fast")
    if name == "op_mseloss":
        return "row", hw.mse_loss, ("naive", "fast")
    return None


def demonstrations(task: Task, formats: tuple[str, ...] = FORMATS) -> list[Demo]:
    """All demonstrations available for a task (empty when none of the generators covers it)."""
    from tasks.demos.codegen import render
    from tasks.demos.compact import plan, render_compact
    from tasks.demos.ir import Unsupported, translate

    out: list[Demo] = []
    hand = _handwritten(task)
    if hand is not None:
        family, fn, variants = hand
        for fmt in formats:
            for v in variants:
                out.append(Demo(task.id, fmt, v, family, fn(task.reference, fmt, v),
                                _NOTES.get((family, v), _NOTES.get((family, "fused" if v == "fast" else v), ""))))
        return out
    try:
        prog = translate(task.reference)
    except Unsupported:
        return []
    family = prog.core_kind
    for fmt in formats:
        for v in ("naive", "fused"):
            out.append(Demo(task.id, fmt, v, family, render(prog, fmt, v), _NOTES[(family, v)]))
        chain = " -> ".join(task.operators)  # the reference's docstring opens with the same chain
        out.append(Demo(task.id, fmt, "compact", family, render_compact(prog, fmt),
                        f"{chain}: {plan(prog)}" if chain else plan(prog)))
    return out
