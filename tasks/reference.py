"""Reference sources in KernelBench format: static inspection, shape parameters, and running them.

A reference is Python source text that defines `class Model(nn.Module)`, `get_inputs()` and
`get_init_inputs()`. Its shape parameters are the module-level integer constants (`batch_size = 16`), read by
`get_inputs` / `get_init_inputs` at call time. `with_shape_params` rewrites those constants in the source text
itself, so a re-sized reference is again a plain, readable file.

Static functions here never execute the source; `load_module` / `instantiate` / `run_reference` do (in the
calling process: run untrusted sources in a worker process, see `tasks.filtering`).
"""

from __future__ import annotations

import ast
import hashlib
import linecache
import sys
import types
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Sequence

if TYPE_CHECKING:  # torch is imported lazily so that `cuda-agent --help` stays fast
    import torch


REQUIRED_NAMES = ("Model", "get_inputs", "get_init_inputs")


@dataclass(frozen=True)
class StaticInfo:
    """What the source shows without running it.

    Fields:
      shape_params: module-level int constants in source order, name -> value.
      has: which of Model / get_inputs / get_init_inputs are defined at module level.
      model_bases: the base-class expressions of `Model` as source text (e.g. ["nn.Module"]).
      forward_calls: dotted names of the calls inside `Model.forward`, in source order.
    """

    shape_params: dict[str, int]
    has: dict[str, bool]
    model_bases: tuple[str, ...]
    forward_calls: tuple[str, ...]


def parse(source: str, origin: str = "<reference>") -> ast.Module:
    """Parse the source. Raises SyntaxError (with `origin` as its filename)."""
    return ast.parse(source, filename=origin)


def _int_constant(node: ast.AST) -> int | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        return node.value
    if (
        isinstance(node, ast.UnaryOp)
        and isinstance(node.op, ast.USub)
        and isinstance(node.operand, ast.Constant)
        and isinstance(node.operand.value, int)
        and not isinstance(node.operand.value, bool)
    ):
        return -node.operand.value
    return None


def _shape_param_nodes(tree: ast.Module) -> list[tuple[str, ast.AST]]:
    out = []
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            if _int_constant(stmt.value) is not None:
                out.append((stmt.targets[0].id, stmt.value))
        elif (  # height, width = 16, 16
            isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Tuple)
            and isinstance(stmt.value, ast.Tuple) and len(stmt.targets[0].elts) == len(stmt.value.elts)
        ):
            for t, v in zip(stmt.targets[0].elts, stmt.value.elts):
                if isinstance(t, ast.Name) and _int_constant(v) is not None:
                    out.append((t.id, v))
        elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value is not None:
            if _int_constant(stmt.value) is not None:
                out.append((stmt.target.id, stmt.value))
    return out


def shape_params(source: str, origin: str = "<reference>") -> dict[str, int]:
    """Module-level int constants of the source, in order (the last assignment of a name wins).

    Raises SyntaxError when the source does not parse.
    """
    tree = parse(source, origin)
    return {name: _int_constant(node) for name, node in _shape_param_nodes(tree)}  # type: ignore[misc]


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    if isinstance(node, ast.Call):  # e.g. x.view(...).sum(...): keep the method name only
        return ".".join(reversed(parts)) if parts else None
    return None


def static_info(source: str, origin: str = "<reference>") -> StaticInfo:
    """Inspect the source without running it. Raises SyntaxError when it does not parse."""
    tree = parse(source, origin)
    has = {n: False for n in REQUIRED_NAMES}
    bases: tuple[str, ...] = ()
    calls: list[str] = []
    for stmt in tree.body:
        if isinstance(stmt, ast.ClassDef) and stmt.name == "Model":
            has["Model"] = True
            bases = tuple(ast.unparse(b) for b in stmt.bases)
            for item in stmt.body:
                if isinstance(item, ast.FunctionDef) and item.name == "forward":
                    for node in ast.walk(item):
                        if isinstance(node, ast.Call):
                            name = _dotted(node.func)
                            if name:
                                calls.append(name)
        elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and stmt.name in has:
            has[stmt.name] = True
        elif isinstance(stmt, ast.Assign):  # get_inputs = some_factory(...) also counts
            for t in stmt.targets:
                if isinstance(t, ast.Name) and t.id in has:
                    has[t.id] = True
    params = {name: _int_constant(node) for name, node in _shape_param_nodes(tree)}
    return StaticInfo(params, has, bases, tuple(calls))  # type: ignore[arg-type]


def with_shape_params(source: str, overrides: Mapping[str, int], origin: str = "<reference>") -> str:
    """The source with the given module-level int constants set to new values (every assignment of each).

    Only the literal is rewritten; comments and layout stay. Raises KeyError naming an override that is not a
    shape parameter of the source, ValueError for a non-int value, SyntaxError when the source does not parse.
    """
    tree = parse(source, origin)
    nodes = _shape_param_nodes(tree)
    known = {n for n, _ in nodes}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise KeyError(f"{origin}: not shape parameters of this reference: {unknown} (known: {sorted(known)})")
    for k, v in overrides.items():
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"{origin}: shape parameter {k} must be an int, got {v!r}")
    lines = source.splitlines(keepends=True)
    # Rewrite from the end so earlier offsets stay valid.
    edits = sorted(
        ((node.lineno, node.col_offset, node.end_lineno, node.end_col_offset, str(overrides[name]))
         for name, node in nodes if name in overrides),
        reverse=True,
    )
    for lineno, col, end_lineno, end_col, text in edits:
        if lineno != end_lineno:  # a literal split over lines: rebuild that span
            head = lines[lineno - 1][:col]
            tail = lines[end_lineno - 1][end_col:]
            lines[lineno - 1 : end_lineno] = [head + text + tail]
        else:
            line = lines[lineno - 1]
            b = line.encode()
            lines[lineno - 1] = (b[:col] + text.encode() + b[end_col:]).decode()
    return "".join(lines)


def load_module(source: str, origin: str = "<reference>") -> types.ModuleType:
    """Execute the source as a fresh module and return it (registered in sys.modules under a unique name).

    The source's lines go into linecache under `origin`, so tracebacks show them. Exceptions raised by the
    source propagate unchanged.
    """
    digest = hashlib.sha256((origin + "\0" + source).encode()).hexdigest()[:16]
    name = f"_cuda_agent_task_{digest}"
    mod = types.ModuleType(name)
    mod.__file__ = origin
    linecache.cache[origin] = (len(source), None, source.splitlines(keepends=True), origin)
    sys.modules[name] = mod
    try:
        code = compile(source, origin, "exec")
        exec(code, mod.__dict__)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return mod


def instantiate(
    mod: types.ModuleType, seed: int = 0, device: str | None = None, input_seed: int | None = None
) -> tuple["torch.nn.Module", list[Any]]:
    """Build `Model(*get_init_inputs())` and `get_inputs()` under fixed seeds; move them to `device`.

    Parameters and inputs are drawn with torch's CPU generator seeded by `seed` (inputs by `input_seed` when
    given), then moved, so a task's numbers do not depend on the device. Exceptions propagate.
    """
    import torch

    torch.manual_seed(seed)
    init = list(mod.get_init_inputs())
    model = mod.Model(*init)
    torch.manual_seed(seed if input_seed is None else input_seed)
    inputs = list(mod.get_inputs())
    if device is not None and device != "cpu":
        model = model.to(device)
        inputs = [x.to(device) if isinstance(x, torch.Tensor) else x for x in inputs]
    return model, inputs


def draw_inputs(get_inputs: Any, seed: int, device: str, on_device: bool = True,
                reraise: tuple[type[BaseException], ...] = ()) -> tuple[Any, bool]:
    """`get_inputs()` after `torch.manual_seed(seed)`; on a CUDA `device` (and with `on_device`) under
    `torch.device(device)`, so its tensor factories draw on the device's seeded generator: no CPU draw and no copy
    (a CPU torch.randn costs about 1.5 ms per MiB, seconds per GPU-sized input set). The numbers differ from a CPU
    draw's, the distribution does not. A get_inputs() that raises under the device context (it calls .numpy(),
    say) is drawn again on the CPU, reseeded, unless its exception is one of `reraise`. An error CUDA reports
    later (a device-side assert) is not caught here. Returns (what get_inputs() returned, drawn on the device)."""
    import torch

    torch.manual_seed(seed)
    if on_device and str(device).startswith("cuda"):
        try:
            with torch.device(device):
                return get_inputs(), True
        except reraise:
            raise
        except Exception:  # noqa: BLE001 - this get_inputs() needs the CPU: draw it there
            torch.manual_seed(seed)
    return get_inputs(), False


def flatten_outputs(out: Any) -> list[Any]:
    """The leaves of a forward result (tensor, or nested tuple / list / dict of them)."""
    if isinstance(out, (tuple, list)):
        return [leaf for o in out for leaf in flatten_outputs(o)]
    if isinstance(out, dict):
        return [leaf for k in sorted(out, key=str) for leaf in flatten_outputs(out[k])]
    return [out]


def run_reference(model: "torch.nn.Module", inputs: Sequence[Any]) -> list["torch.Tensor"]:
    """One forward under `torch.no_grad()`; returns the output leaves (not checked here)."""
    import torch

    with torch.no_grad():
        return flatten_outputs(model(*inputs))
