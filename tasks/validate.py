"""Validation of task references, with errors that name the file and the problem.

Two levels:
  - `check_static(source, origin)`: parses the source and checks that `Model`, `get_inputs` and
    `get_init_inputs` are defined at module level. Runs nothing.
  - `check_runtime(source, origin)`: executes the source, builds the model, runs forward twice from the same
    seeds and checks that the outputs are tensors and are bitwise identical (deterministic).

Every failure raises `TaskValidationError` whose message reads `"<origin>: <problem>: <detail>"`, with
`problem` one of PROBLEMS. `check_runtime` executes the source in the calling process: for untrusted sources
use the worker pool in `tasks.filtering`.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field
from typing import Any

from tasks import reference as ref
from tasks.schema import Task

PROBLEMS = {
    "syntax_error": "the source does not parse",
    "no_model": "no `class Model` at module level",
    "no_get_inputs": "no `get_inputs()` at module level",
    "no_get_init_inputs": "no `get_init_inputs()` at module level",
    "import_error": "executing the module raised",
    "model_not_module": "`Model` is not a torch.nn.Module subclass",
    "init_error": "`get_init_inputs()` or `Model(...)` raised",
    "inputs_error": "`get_inputs()` raised or returned something other than a list/tuple",
    "forward_error": "`Model.forward` raised",
    "non_tensor_output": "forward returned something other than tensors",
    "empty_output": "forward returned no tensor or an empty tensor",
    "not_deterministic": "two runs from the same seeds gave different outputs",
    "bad_shape_params": "the record's shape_params are not module-level int constants of the reference",
}


class TaskValidationError(ValueError):
    """A reference that is not a valid task.

    Attributes:
      origin: the file (or dataset row / task id) the reference came from.
      problem: one of `tasks.validate.PROBLEMS`.
      detail: what exactly went wrong (exception text, offending type, max difference...).
    """

    def __init__(self, origin: str, problem: str, detail: str = ""):
        if problem not in PROBLEMS:
            raise ValueError(f"unknown validation problem {problem!r}")
        self.origin, self.problem, self.detail = origin, problem, detail
        msg = f"{origin}: {problem}: {PROBLEMS[problem]}"
        if detail:
            msg += f": {detail}"
        super().__init__(msg)

    def __reduce__(self):  # picklable across worker processes
        return (TaskValidationError, (self.origin, self.problem, self.detail))


@dataclass
class RuntimeInfo:
    """What one validated run showed.

    Fields:
      input_shapes: shape of each tensor input (None for a non-tensor input), in get_inputs order.
      output_shapes, output_dtypes: of each output leaf.
      init_inputs: the repr of each get_init_inputs() value (for display).
    """

    input_shapes: list[list[int] | None] = field(default_factory=list)
    output_shapes: list[list[int]] = field(default_factory=list)
    output_dtypes: list[str] = field(default_factory=list)
    init_inputs: list[str] = field(default_factory=list)


def _reraise_device_oom(e: BaseException, wanted: bool) -> None:
    """With `wanted`, a device out-of-memory error (torch.OutOfMemoryError) is raised as it is: it says what else
    runs on the GPU, not what the task is (tasks.filtering checks such a task again)."""
    import torch

    if wanted and isinstance(e, torch.OutOfMemoryError):
        raise e


def _exc_summary(e: BaseException, origin: str) -> str:
    """`Type: message (at line N)` using the deepest frame inside the reference source."""
    line = ""
    for fs in reversed(traceback.extract_tb(e.__traceback__)):
        if fs.filename == origin:
            line = f" (line {fs.lineno}: {(fs.line or '').strip()})"
            break
    text = str(e).strip().splitlines()
    first = text[0] if text else ""
    return f"{type(e).__name__}: {first[:300]}{line}"


def check_static(source: str, origin: str) -> ref.StaticInfo:
    """Parse and check the required names. Raises TaskValidationError (syntax_error / no_*)."""
    try:
        info = ref.static_info(source, origin)
    except SyntaxError as e:
        raise TaskValidationError(origin, "syntax_error", f"line {e.lineno}: {e.msg}") from None
    for name, problem in (("Model", "no_model"), ("get_inputs", "no_get_inputs"),
                          ("get_init_inputs", "no_get_init_inputs")):
        if not info.has[name]:
            raise TaskValidationError(origin, problem)
    return info


def load_checked(source: str, origin: str):
    """Static checks, then execute the module and check `Model` is an nn.Module. Returns the module."""
    import torch

    check_static(source, origin)
    try:
        mod = ref.load_module(source, origin)
    except Exception as e:
        raise TaskValidationError(origin, "import_error", _exc_summary(e, origin)) from None
    if not (isinstance(mod.Model, type) and issubclass(mod.Model, torch.nn.Module)):
        raise TaskValidationError(origin, "model_not_module", f"got {mod.Model!r:.80}")
    return mod


def build_and_run(mod, origin: str, seed: int = 0, device: str | None = None, input_seed: int | None = None,
                  raise_oom: bool = False, on_device: bool = False):
    """Instantiate and run once; returns (model, inputs, output leaves). Raises TaskValidationError; with
    raise_oom, a torch.OutOfMemoryError is raised as it is (tasks.filtering on a GPU: other workers may hold the
    memory), else it is the task's init / inputs / forward error like any other.

    on_device (a CUDA `device` only): the input set is drawn on the device, as the sandbox draws its sets
    (tasks.reference.draw_inputs, with a CPU draw for a get_inputs() that needs the CPU). `Model(...)` is built on
    the CPU and moved, as the sandbox builds it: tensors it keeps as plain attributes stay where __init__ put them.
    """
    import torch

    try:
        torch.manual_seed(seed)
        init = mod.get_init_inputs()
        model = mod.Model(*init)
    except Exception as e:
        _reraise_device_oom(e, raise_oom)
        raise TaskValidationError(origin, "init_error", _exc_summary(e, origin)) from None
    try:
        inputs, _ = ref.draw_inputs(mod.get_inputs, seed if input_seed is None else input_seed, str(device), on_device,
                                (torch.OutOfMemoryError,) if raise_oom else ())
    except Exception as e:
        _reraise_device_oom(e, raise_oom)
        raise TaskValidationError(origin, "inputs_error", _exc_summary(e, origin)) from None
    if not isinstance(inputs, (list, tuple)):
        raise TaskValidationError(origin, "inputs_error", f"get_inputs() returned {type(inputs).__name__}")
    inputs = list(inputs)
    if device is not None and device != "cpu":
        model = model.to(device)
        inputs = [x.to(device) if isinstance(x, torch.Tensor) else x for x in inputs]
    try:
        with torch.no_grad():
            out = model(*inputs)
    except Exception as e:
        _reraise_device_oom(e, raise_oom)
        raise TaskValidationError(origin, "forward_error", _exc_summary(e, origin)) from None
    leaves = ref.flatten_outputs(out)
    bad = [type(x).__name__ for x in leaves if not isinstance(x, torch.Tensor)]
    if bad:
        raise TaskValidationError(origin, "non_tensor_output", f"got {', '.join(sorted(set(bad)))}")
    if not leaves or any(x.numel() == 0 for x in leaves):
        raise TaskValidationError(origin, "empty_output")
    return model, inputs, leaves


def outputs_equal(a: list[Any], b: list[Any]) -> tuple[bool, float]:
    """Bitwise comparison of two output lists (NaN equal to NaN); returns (equal, max abs difference)."""
    import torch

    if len(a) != len(b):
        return False, float("inf")
    worst = 0.0
    same = True
    for x, y in zip(a, b):
        if x.shape != y.shape or x.dtype != y.dtype:
            return False, float("inf")
        if not torch.equal(x, y):
            both_nan = torch.isnan(x) & torch.isnan(y) if x.is_floating_point() else None
            diff = x != y
            if both_nan is not None:
                diff = diff & ~both_nan
            if bool(diff.any()):
                same = False
                d = (x.double() - y.double()).abs()
                d = d[torch.isfinite(d)]
                worst = max(worst, float(d.max()) if d.numel() else float("inf"))
    return same, worst


def check_runtime(source: str, origin: str, seed: int = 0, determinism: bool = True,
                  device: str | None = None) -> RuntimeInfo:
    """Execute, build, run (twice when `determinism`), and check the outputs. Raises TaskValidationError."""
    import torch

    mod = load_checked(source, origin)
    model, inputs, out1 = build_and_run(mod, origin, seed, device)
    if determinism:
        _, _, out2 = build_and_run(mod, origin, seed, device)
        same, worst = outputs_equal(out1, out2)
        if not same:
            raise TaskValidationError(origin, "not_deterministic", f"max abs difference {worst:.3g}")
    return RuntimeInfo(
        input_shapes=[list(x.shape) if isinstance(x, torch.Tensor) else None for x in inputs],
        output_shapes=[list(o.shape) for o in out1],
        output_dtypes=[str(o.dtype).replace("torch.", "") for o in out1],
        init_inputs=[repr(v)[:40] for v in mod.get_init_inputs()],
    )


def origin_of(task: Task) -> str:
    """The best name for where a task came from: its source path if known, else `task:<id>`."""
    return str(task.provenance.get("path") or f"task:{task.id}")


def validate_task(task: Task, runtime: bool = True, determinism: bool = True) -> RuntimeInfo | None:
    """Validate a task record's reference (static, then runtime unless `runtime=False`).

    Also checks that `task.shape_params` names module-level int constants of the reference. Raises
    TaskValidationError.
    """
    origin = origin_of(task)
    info = check_static(task.reference, origin)
    missing = sorted(set(task.shape_params) - set(info.shape_params))
    if missing:
        raise TaskValidationError(origin, "bad_shape_params", f"unknown: {missing}")
    if not runtime:
        return None
    return check_runtime(task.reference, origin, determinism=determinism)
