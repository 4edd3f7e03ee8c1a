"""A small operator graph with symbolic shapes, rendered as a KernelBench-format reference.

Shapes are tuples of `Dim`: a Python expression over shape-parameter names (`"channels"`,
`"(height + 1) // 2"`) plus its value at the default sizes. Every op in `tasks.operators` transforms the shape
of the running value exactly as torch does, so a composed graph is valid by construction, and the rendered
file declares its sizes as module-level int constants (its shape parameters) that `get_inputs` /
`get_init_inputs` read.

The graph is a chain on one running value `x` (each op consumes the previous op's result) with optional
second operands: an extra input of `get_inputs()`, an earlier value of the chain (a residual), or a learned
parameter. Layout tags say what the axes mean, so ops pick sensible axes:

  vec [N] · rows [N, D] · seq [B, L, D] · ncl [N, C, L] · nchw [N, C, H, W] · ncdhw [N, C, D, H, W] ·
  scalar []
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

LAYOUT_RANK = {"scalar": 0, "vec": 1, "rows": 2, "seq": 3, "ncl": 3, "nchw": 4, "ncdhw": 5}
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class Dim:
    """One axis: `expr` over shape-parameter names (valid Python), `value` at the default sizes."""

    expr: str
    value: int

    def _wrap(self) -> str:
        return self.expr if _IDENT.match(self.expr) or self.expr.isdigit() else f"({self.expr})"

    def floordiv(self, k: int) -> "Dim":
        return Dim(f"{self._wrap()} // {k}", self.value // k)

    def ceildiv2(self) -> "Dim":
        """ceil(n / 2), what a stride-2, kernel-3, padding-1 convolution gives."""
        return Dim(f"({self._wrap()} + 1) // 2", (self.value + 1) // 2)

    def times(self, k: int) -> "Dim":
        return Dim(f"{self._wrap()} * {k}", self.value * k)

    def plus(self, k: int) -> "Dim":
        return Dim(f"{self.expr} + {k}", self.value + k)

    def mul(self, other: "Dim") -> "Dim":
        return Dim(f"{self._wrap()} * {other._wrap()}", self.value * other.value)


def const(v: int) -> Dim:
    return Dim(str(v), v)


@dataclass(frozen=True)
class Value:
    """A tensor in the graph: its shape, its layout tag and its dtype kind ("float" or "int")."""

    shape: tuple[Dim, ...]
    layout: str

    def __post_init__(self) -> None:
        if LAYOUT_RANK[self.layout] != len(self.shape):
            raise ValueError(f"layout {self.layout} has rank {LAYOUT_RANK[self.layout]}, shape has {len(self.shape)}")

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d.value
        return n

    def same_shape(self, other: "Value") -> bool:
        return tuple(d.expr for d in self.shape) == tuple(d.expr for d in other.shape)


@dataclass
class _Input:
    name: str
    ctor: str  # expression that builds it in get_inputs()


@dataclass
class Builder:
    """Accumulates shape parameters, modules, inputs and forward lines while ops are applied.

    Ops call `param`, `module`, `extra_input`, `saved` and `emit`; `render` writes the file.
    """

    params: dict[str, int] = field(default_factory=dict)
    modules: list[tuple[str, str]] = field(default_factory=list)
    inputs: list[_Input] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    ops: list[str] = field(default_factory=list)
    categories: list[str] = field(default_factory=list)
    history: list[tuple[Value, int]] = field(default_factory=list)  # chain values and the line after which they exist
    op_spans: list[tuple[int, int]] = field(default_factory=list)  # [start, end) of each op in `lines`
    op_preserves: list[bool] = field(default_factory=list)  # op output has its input's shape and layout
    op_lines: list[tuple[int, int]] = field(default_factory=list)  # after render: 1-based first/last source line
    _saved: dict[int, str] = field(default_factory=dict)
    _save_points: dict[int, int] = field(default_factory=dict)
    _names: set[str] = field(default_factory=set)

    # -- names -------------------------------------------------------------------------------------------
    def _unique(self, hint: str) -> str:
        name, i = hint, 2
        while name in self._names or name in _RESERVED:
            name, i = f"{hint}_{i}", i + 1
        self._names.add(name)
        return name

    def param(self, hint: str, value: int) -> Dim:
        """A new shape parameter (module-level int constant) named after `hint`."""
        name = self._unique(hint)
        self.params[name] = int(value)
        return Dim(name, int(value))

    def module(self, hint: str, ctor: str) -> str:
        """Register `self.<name> = <ctor>` in __init__; returns `self.<name>` for use in forward."""
        name = self._unique(hint)
        self.modules.append((name, ctor))
        return f"self.{name}"

    def extra_input(self, hint: str, ctor: str) -> str:
        """A further argument of forward, built in get_inputs() by `ctor`. Returns its name."""
        name = self._unique(hint)
        self.inputs.append(_Input(name, ctor))
        return name

    # -- chain -------------------------------------------------------------------------------------------
    def start(self, value: Value, ctor: str) -> Value:
        self.inputs.insert(0, _Input("x", ctor))
        self._names.add("x")
        self.history.append((value, 0))
        return value

    def emit(self, stmt: str, out: Value, op: str, category: str) -> Value:
        """Add forward statement(s) (`{x}` is the running value; default form `x = <expr>`)."""
        before = self.history[-1][0] if self.history else None
        start = len(self.lines)
        for line in stmt.split("\n"):
            self.lines.append(line.replace("{x}", "x"))
        self.ops.append(op)
        self.categories.append(category)
        self.op_spans.append((start, len(self.lines)))
        self.op_preserves.append(before is not None and before.same_shape(out) and before.layout == out.layout)
        self.history.append((out, len(self.lines)))
        return out

    def saved(self, index: int) -> str:
        """A name for chain value `index` (0 = the input), saved right after it is computed."""
        if index not in self._saved:
            name = self._unique("residual" if index else "identity")
            self._saved[index] = name
            self._save_points[index] = self.history[index][1]
        return self._saved[index]

    def residual_candidates(self, value: Value) -> list[int]:
        """Indices of earlier chain values with the same shape as `value` (excluding the current one)."""
        return [i for i, (v, _) in enumerate(self.history[:-1]) if v.same_shape(value) and v.layout == value.layout]

    # -- output ------------------------------------------------------------------------------------------
    def _init_args(self) -> list[str]:
        used = set()
        text = "\n".join(c for _, c in self.modules)
        for name in self.params:
            if re.search(rf"\b{re.escape(name)}\b", text):
                used.add(name)
        return [n for n in self.params if n in used]

    def forward_lines(self) -> tuple[list[str], list[int]]:
        """Forward body lines (residual saves inserted) and, per entry of `lines`, its index in the body."""
        out: list[str] = []
        where: list[int] = []
        # save points refer to positions in self.lines: insert `name = x` after them
        by_point: dict[int, list[str]] = {}
        for idx, name in self._saved.items():
            by_point.setdefault(self._save_points[idx], []).append(name)
        for name in by_point.get(0, []):
            out.append(f"{name} = x")
        for i, line in enumerate(self.lines, 1):
            where.append(len(out))
            out.append(line)
            for name in by_point.get(i, []):
                out.append(f"{name} = x")
        out.append("return x")
        return out, where

    def render(self, doc: str) -> str:
        """The reference source, KernelBench format: imports, shape parameters, Model, get_inputs, get_init_inputs."""
        init_args = self._init_args()
        fwd_args = ", ".join(i.name for i in self.inputs)
        parts = ['"""' + doc.strip() + '\n"""', "", "import torch", "import torch.nn as nn",
                 "import torch.nn.functional as F", ""]
        for name, value in self.params.items():
            parts.append(f"{name} = {value}")
        parts += ["", "", "class Model(nn.Module):"]
        parts.append(f"    def __init__(self{''.join(', ' + a for a in init_args)}):")
        parts.append("        super().__init__()")
        for name, ctor in self.modules:
            parts.append(f"        self.{name} = {ctor}")
        parts += ["", f"    def forward(self, {fwd_args}):"]
        body, where = self.forward_lines()
        first_body_line = len("\n".join(parts).split("\n")) + 1  # 1-based source line of body[0]
        self.op_lines = [(first_body_line + where[a], first_body_line + where[b - 1]) for a, b in self.op_spans]
        parts += ["        " + line for line in body]
        parts += ["", "", "def get_inputs():"]
        if len(self.inputs) == 1:
            parts.append(f"    return [{self.inputs[0].ctor}]")
        else:
            for i in self.inputs:
                parts.append(f"    {i.name} = {i.ctor}")
            parts.append(f"    return [{', '.join(i.name for i in self.inputs)}]")
        parts += ["", "", "def get_init_inputs():", f"    return [{', '.join(init_args)}]", ""]
        return "\n".join(parts)


_RESERVED = {"torch", "nn", "F", "Model", "get_inputs", "get_init_inputs", "self", "x", "super", "math"}


def shape_expr(value: Value) -> str:
    """`a, b, c` for use inside torch.randn(...)."""
    return ", ".join(d.expr for d in value.shape)
