"""The curated registry of drivable seed operators: shape rules, argument generators, category, arity.

Each `OpSpec` drives one operator mined from torch (`torch_name`, e.g. "torch.nn.functional.gelu" or
"torch.nn.Conv2d"): given the running value of a graph (`tasks.graph.Value`) it picks valid arguments with a
`random.Random`, registers modules, parameters or extra inputs it needs, emits the forward statement and
returns the output value with its exact shape. `layouts` says which inputs it accepts; `accepts` adds finer
conditions (divisibility, minimum sizes); `terminal` ops (losses reducing to a scalar) may only end a graph.

The registry is the tuple `REGISTRY`; look ops up with `by_name()`. It is plain data plus functions: no
registration decorators.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Callable

from tasks.graph import Builder, Dim, Value, const, shape_expr

ANY = frozenset({"vec", "rows", "seq", "ncl", "nchw", "ncdhw"})
SPATIAL = frozenset({"ncl", "nchw", "ncdhw"})
FEATURES = frozenset({"rows", "seq"})


class NotApplicable(Exception):
    """Raised by an op's `apply` when no valid arguments fit the size limits; the composer picks another op."""


@dataclass(frozen=True)
class SizeProfile:
    """Default sizes for new axes (CPU-sized; GPU-sized tasks are scaled up afterwards, see tasks.sizing).

    Fields:
      features: choices for new feature sizes (Linear out_features, projection widths).
      channels: choices for new channel counts (conv out_channels).
      max_numel: largest number of elements any value of a graph may have.
      max_params: largest parameter count of one module.
    """

    features: tuple[int, ...] = (64, 128, 256)
    channels: tuple[int, ...] = (8, 16, 32)
    max_numel: int = 1 << 20
    max_params: int = 1 << 21


@dataclass(frozen=True)
class OpSpec:
    """One drivable operator.

    Fields:
      name: registry name (unique), e.g. "conv2d_strided".
      category: one of tasks.categories.CATEGORIES.
      torch_name: the mined torch operator it drives (a dotted path that resolves in torch).
      arity: number of tensor operands (1 unary; 2 when a second tensor - input, residual or parameter - joins).
      layouts: input layouts it accepts.
      apply: (builder, value, rng, profile) -> output value; emits code into the builder.
      accepts: extra condition on the input value (default: always).
      terminal: the op reduces to a scalar (a loss) and may only end a graph.
      preserves_shape: output shape and layout equal the input's.
    """

    name: str
    category: str
    torch_name: str
    arity: int
    layouts: frozenset[str]
    apply: Callable[[Builder, Value, random.Random, SizeProfile], Value]
    accepts: Callable[[Value], bool] = field(default=lambda v: True)
    terminal: bool = False
    preserves_shape: bool = False

    def applicable(self, v: Value) -> bool:
        return v.layout in self.layouts and self.accepts(v)


def feature_axis(v: Value) -> int:
    """The axis that holds features/channels: last for vec/rows/seq, 1 for channel-first layouts."""
    return 1 if v.layout in SPATIAL else len(v.shape) - 1


def _fdim(v: Value) -> Dim:
    return v.shape[feature_axis(v)]


def _axis_arg(v: Value) -> str:
    return "1" if v.layout in SPATIAL else "-1"


# --------------------------------------------------------------------------------------------------------
# helpers that build OpSpecs


def _unary(name: str, category: str, torch_name: str, expr: Callable[[random.Random], str] | str,
           layouts: frozenset[str] = ANY, accepts: Callable[[Value], bool] | None = None) -> OpSpec:
    def apply(b: Builder, x: Value, rng: random.Random, p: SizeProfile) -> Value:
        e = expr(rng) if callable(expr) else expr
        return b.emit(f"x = {e}", x, name, category)

    return OpSpec(name, category, torch_name, 1, layouts, apply, accepts or (lambda v: True),
                  preserves_shape=True)


def _param_shape(x: Value) -> str:
    """Shape of a learned per-feature tensor that broadcasts against `x`."""
    d = _fdim(x).expr
    if x.layout in SPATIAL:
        return ", ".join([d] + ["1"] * (len(x.shape) - 2))
    return d


def _partner(b: Builder, x: Value, rng: random.Random, allow_param: bool = True, hint: str = "y") -> str:
    """A second operand with x's shape (or broadcasting to it): a residual, an extra input, or a parameter."""
    kinds = ["input"]
    if b.residual_candidates(x):
        kinds += ["residual", "residual"]
    if allow_param and x.layout != "vec":
        kinds.append("param")
    kind = rng.choice(kinds)
    if kind == "residual":
        return b.saved(rng.choice(b.residual_candidates(x)))
    if kind == "param":
        return b.module("weight" if hint == "y" else hint, f"nn.Parameter(torch.randn({_param_shape(x)}))")
    return b.extra_input(hint, f"torch.randn({shape_expr(x)})")


def _binary(name: str, category: str, torch_name: str, expr: str, allow_param: bool = True,
            layouts: frozenset[str] = ANY) -> OpSpec:
    def apply(b: Builder, x: Value, rng: random.Random, p: SizeProfile) -> Value:
        y = _partner(b, x, rng, allow_param)
        return b.emit("x = " + expr.format(x="{x}", y=y, w=round(rng.uniform(0.2, 0.8), 2)), x, name, category)

    return OpSpec(name, category, torch_name, 2, layouts, apply, preserves_shape=True)


def _param_binary(name: str, category: str, torch_name: str, expr: str, hint: str, init: str) -> OpSpec:
    def apply(b: Builder, x: Value, rng: random.Random, p: SizeProfile) -> Value:
        w = b.module(hint, f"nn.Parameter({init.format(shape=_param_shape(x))})")
        return b.emit("x = " + expr.format(x="{x}", w=w), x, name, category)

    return OpSpec(name, category, torch_name, 2, ANY - {"vec"}, apply, preserves_shape=True)


# --------------------------------------------------------------------------------------------------------
# activation


def _activations() -> list[OpSpec]:
    A = "activation"
    ops = [
        _unary("relu", A, "torch.nn.functional.relu", "F.relu({x})"),
        _unary("relu6", A, "torch.nn.functional.relu6", "F.relu6({x})"),
        _unary("gelu", A, "torch.nn.functional.gelu",
               lambda r: r.choice(["F.gelu({x})", 'F.gelu({x}, approximate="tanh")'])),
        _unary("silu", A, "torch.nn.functional.silu", "F.silu({x})"),
        _unary("sigmoid", A, "torch.sigmoid", "torch.sigmoid({x})"),
        _unary("tanh", A, "torch.tanh", "torch.tanh({x})"),
        _unary("softplus", A, "torch.nn.functional.softplus",
               lambda r: f"F.softplus({{x}}, beta={r.choice([1.0, 2.0])})"),
        _unary("elu", A, "torch.nn.functional.elu", lambda r: f"F.elu({{x}}, alpha={r.choice([0.5, 1.0])})"),
        _unary("leaky_relu", A, "torch.nn.functional.leaky_relu",
               lambda r: f"F.leaky_relu({{x}}, negative_slope={r.choice([0.01, 0.1, 0.2])})"),
        _unary("hardtanh", A, "torch.nn.functional.hardtanh",
               lambda r: (lambda a: f"F.hardtanh({{x}}, min_val=-{a}, max_val={a})")(r.choice([1.0, 2.0, 3.0]))),
        _unary("hardswish", A, "torch.nn.functional.hardswish", "F.hardswish({x})"),
        _unary("hardsigmoid", A, "torch.nn.functional.hardsigmoid", "F.hardsigmoid({x})"),
        _unary("mish", A, "torch.nn.functional.mish", "F.mish({x})"),
        _unary("selu", A, "torch.nn.functional.selu", "F.selu({x})"),
        _unary("celu", A, "torch.nn.functional.celu", lambda r: f"F.celu({{x}}, alpha={r.choice([0.5, 1.0])})"),
        _unary("softsign", A, "torch.nn.functional.softsign", "F.softsign({x})"),
        _unary("logsigmoid", A, "torch.nn.functional.logsigmoid", "F.logsigmoid({x})"),
        _unary("tanhshrink", A, "torch.nn.functional.tanhshrink", "F.tanhshrink({x})"),
        _unary("softshrink", A, "torch.nn.functional.softshrink",
               lambda r: f"F.softshrink({{x}}, lambd={r.choice([0.25, 0.5])})"),
        _unary("hardshrink", A, "torch.nn.functional.hardshrink",
               lambda r: f"F.hardshrink({{x}}, lambd={r.choice([0.25, 0.5])})"),
    ]

    def prelu(b: Builder, x: Value, rng: random.Random, p: SizeProfile) -> Value:
        per_channel = x.layout != "seq" and x.layout != "vec"
        arg = _fdim(x).expr if per_channel else "1"
        m = b.module("prelu", f"nn.PReLU(num_parameters={arg}, init={rng.choice([0.1, 0.25])})")
        return b.emit(f"x = {m}({{x}})", x, "prelu", A)

    ops.append(OpSpec("prelu", A, "torch.nn.PReLU", 1, ANY, prelu, preserves_shape=True))

    def glu(b: Builder, x: Value, rng: random.Random, p: SizeProfile) -> Value:
        ax = feature_axis(x)
        shape = list(x.shape)
        shape[ax] = shape[ax].floordiv(2)
        return b.emit(f"x = F.glu({{x}}, dim={_axis_arg(x)})", Value(tuple(shape), x.layout), "glu", A)

    ops.append(OpSpec("glu", A, "torch.nn.functional.glu", 1, ANY - {"vec"}, glu,
                      accepts=lambda v: _fdim(v).value % 2 == 0 and _fdim(v).value >= 4))
    return ops


# --------------------------------------------------------------------------------------------------------
# elementwise math


def _elementwise() -> list[OpSpec]:
    E = "elementwise"
    return [
        _unary("abs", E, "torch.abs", "torch.abs({x})"),
        _unary("neg", E, "torch.neg", "torch.neg({x})"),
        _unary("exp", E, "torch.exp", "torch.exp({x})"),
        _unary("log1p", E, "torch.log1p", "torch.log1p(torch.abs({x}))"),
        _unary("sqrt", E, "torch.sqrt", "torch.sqrt(torch.abs({x}) + 1e-6)"),
        _unary("rsqrt", E, "torch.rsqrt", "torch.rsqrt(torch.abs({x}) + 1.0)"),
        _unary("square", E, "torch.square", "torch.square({x})"),
        _unary("sin", E, "torch.sin", "torch.sin({x})"),
        _unary("cos", E, "torch.cos", "torch.cos({x})"),
        _unary("erf", E, "torch.erf", "torch.erf({x})"),
        _unary("atan", E, "torch.atan", "torch.atan({x})"),
        _unary("reciprocal", E, "torch.reciprocal", "torch.reciprocal(1.0 + torch.abs({x}))"),
        _unary("clamp", E, "torch.clamp",
               lambda r: (lambda c: f"torch.clamp({{x}}, min=-{c}, max={c})")(r.choice([0.5, 1.0, 2.0]))),
        _unary("scale", E, "torch.mul", lambda r: f"{{x}} * {r.choice([0.5, 2.0, 1.5, 0.1])}"),
        _unary("shift", E, "torch.add", lambda r: f"{{x}} + {r.choice([0.5, 1.0, -0.25])}"),
        _unary("pow", E, "torch.pow", lambda r: f"torch.pow({{x}}, {r.choice([2, 3])})"),
        _binary("add", E, "torch.add", "{x} + {y}"),
        _binary("sub", E, "torch.sub", "{x} - {y}"),
        _binary("mul", E, "torch.mul", "{x} * {y}"),
        _binary("div", E, "torch.div", "{x} / (torch.abs({y}) + 1.0)"),
        _binary("maximum", E, "torch.maximum", "torch.maximum({x}, {y})", allow_param=False),
        _binary("minimum", E, "torch.minimum", "torch.minimum({x}, {y})", allow_param=False),
        _binary("where", E, "torch.where", "torch.where({x} > 0, {x}, {y})", allow_param=False),
        _binary("lerp", E, "torch.lerp", "torch.lerp({x}, {y}, {w})", allow_param=False),
        _param_binary("bias_add", E, "torch.Tensor.add", "{x} + {w}", "bias", "torch.randn({shape})"),
        _param_binary("scale_mul", E, "torch.Tensor.mul", "{x} * {w}", "scale", "torch.rand({shape}) + 0.5"),
        _param_binary("addcmul", E, "torch.addcmul", "torch.addcmul({x}, {x}, {w}, value=0.5)", "gate",
                      "torch.randn({shape})"),
    ]


# --------------------------------------------------------------------------------------------------------
# reductions


def _reduce_plan(x: Value, rng: random.Random) -> tuple[str, Value] | None:
    """Pick the axes to reduce for a layout: (dim argument, output value). Never reduces the batch axis."""
    s = x.shape
    opts: list[tuple[str, Value]] = []
    if x.layout == "vec":
        opts.append(("0", Value((), "scalar")))
    elif x.layout == "rows":
        opts.append(("-1", Value((s[0],), "vec")))
    elif x.layout == "seq":
        opts.append(("1", Value((s[0], s[2]), "rows")))
        opts.append(("-1", Value((s[0], s[1]), "rows")))
    elif x.layout == "ncl":
        opts.append(("-1", Value((s[0], s[1]), "rows")))
        opts.append(("1, keepdim=True", Value((s[0], const(1), s[2]), "ncl")))
    elif x.layout == "nchw":
        opts.append(("(2, 3)", Value((s[0], s[1]), "rows")))
        opts.append(("1, keepdim=True", Value((s[0], const(1), s[2], s[3]), "nchw")))
    elif x.layout == "ncdhw":
        opts.append(("(2, 3, 4)", Value((s[0], s[1]), "rows")))
        opts.append(("1, keepdim=True", Value((s[0], const(1), s[2], s[3], s[4]), "ncdhw")))
    return rng.choice(opts) if opts else None


def _reduction(name: str, torch_name: str, fmt: str, tuple_dims: bool = True) -> OpSpec:
    def apply(b: Builder, x: Value, rng: random.Random, p: SizeProfile) -> Value:
        plan = _reduce_plan(x, rng)
        assert plan is not None
        dim, out = plan
        if not tuple_dims and dim.startswith("("):  # ops that take one dim: flatten the spatial axes first
            x_flat = f"{{x}}.flatten(2)"
            return b.emit("x = " + fmt.format(x=x_flat, dim="-1"), out, name, "reduction")
        return b.emit("x = " + fmt.format(x="{x}", dim=dim), out, name, "reduction")

    return OpSpec(name, "reduction", torch_name, 1, ANY, apply,
                  accepts=lambda v: all(d.value > 1 for d in v.shape[1:]) if v.layout != "vec" else v.shape[0].value > 1,
                  terminal=False)


def _reductions() -> list[OpSpec]:
    return [
        _reduction("sum", "torch.sum", "torch.sum({x}, dim={dim})"),
        _reduction("mean", "torch.mean", "torch.mean({x}, dim={dim})"),
        _reduction("amax", "torch.amax", "torch.amax({x}, dim={dim})"),
        _reduction("amin", "torch.amin", "torch.amin({x}, dim={dim})"),
        _reduction("var", "torch.var", "torch.var({x}, dim={dim})"),
        _reduction("std", "torch.std", "torch.std({x}, dim={dim})"),
        _reduction("logsumexp", "torch.logsumexp", "torch.logsumexp({x}, dim={dim})"),
        _reduction("vector_norm", "torch.linalg.vector_norm", "torch.linalg.vector_norm({x}, dim={dim})"),
        _reduction("max_dim", "torch.max", "torch.max({x}, dim={dim}).values", tuple_dims=False),
    ]


# --------------------------------------------------------------------------------------------------------
# normalization and softmax


def _normalizations() -> list[OpSpec]:
    N = "normalization"
    ops: list[OpSpec] = []

    def module_norm(name: str, torch_name: str, layouts: frozenset[str], ctor: Callable[[Value, random.Random], str],
                    accepts: Callable[[Value], bool] = lambda v: True) -> OpSpec:
        def apply(b: Builder, x: Value, rng: random.Random, p: SizeProfile) -> Value:
            m = b.module("norm", ctor(x, rng))
            return b.emit(f"x = {m}({{x}})", x, name, N)

        return OpSpec(name, N, torch_name, 1, layouts, apply, accepts, preserves_shape=True)

    def layer_norm_ctor(x: Value, rng: random.Random) -> str:
        if x.layout in FEATURES:
            return f"nn.LayerNorm({x.shape[-1].expr})"
        return f"nn.LayerNorm([{', '.join(d.expr for d in x.shape[1:])}])"

    def groups(v: Value) -> list[int]:
        c = v.shape[1].value
        return [g for g in (2, 4, 8) if c % g == 0 and g < c]

    ops += [
        module_norm("layer_norm", "torch.nn.LayerNorm", frozenset({"rows", "seq", "ncl", "nchw"}), layer_norm_ctor),
        module_norm("rms_norm", "torch.nn.RMSNorm", FEATURES, lambda x, r: f"nn.RMSNorm({x.shape[-1].expr})"),
        module_norm("batch_norm1d", "torch.nn.BatchNorm1d", frozenset({"rows", "ncl"}),
                    lambda x, r: f"nn.BatchNorm1d({x.shape[1].expr})", accepts=lambda v: v.shape[0].value > 1),
        module_norm("batch_norm2d", "torch.nn.BatchNorm2d", frozenset({"nchw"}),
                    lambda x, r: f"nn.BatchNorm2d({x.shape[1].expr})"),
        module_norm("batch_norm3d", "torch.nn.BatchNorm3d", frozenset({"ncdhw"}),
                    lambda x, r: f"nn.BatchNorm3d({x.shape[1].expr})"),
        module_norm("group_norm", "torch.nn.GroupNorm", SPATIAL,
                    lambda x, r: f"nn.GroupNorm({r.choice(groups(x))}, {x.shape[1].expr})",
                    accepts=lambda v: bool(groups(v))),
        module_norm("instance_norm1d", "torch.nn.InstanceNorm1d", frozenset({"ncl"}),
                    lambda x, r: f"nn.InstanceNorm1d({x.shape[1].expr}, affine=True)",
                    accepts=lambda v: v.shape[2].value > 1),
        module_norm("instance_norm2d", "torch.nn.InstanceNorm2d", frozenset({"nchw"}),
                    lambda x, r: f"nn.InstanceNorm2d({x.shape[1].expr}, affine=True)",
                    accepts=lambda v: v.shape[2].value * v.shape[3].value > 1),
        module_norm("instance_norm3d", "torch.nn.InstanceNorm3d", frozenset({"ncdhw"}),
                    lambda x, r: f"nn.InstanceNorm3d({x.shape[1].expr}, affine=True)"),
        _unary("l2_normalize", N, "torch.nn.functional.normalize", "F.normalize({x}, p=2.0, dim=-1)",
               layouts=ANY - {"vec"}),
        _unary("local_response_norm", N, "torch.nn.functional.local_response_norm",
               lambda r: f"F.local_response_norm({{x}}, size={r.choice([3, 5])})",
               layouts=frozenset({"ncl", "nchw"}), accepts=lambda v: v.shape[1].value >= 4),
    ]
    return ops


def _softmaxes() -> list[OpSpec]:
    """Softmax-family ops normalise over the feature axis of the value they see."""
    S = "softmax"

    def op(name: str, torch_name: str, fmt: str) -> OpSpec:
        def apply(b: Builder, x: Value, rng: random.Random, p: SizeProfile) -> Value:
            return b.emit("x = " + fmt.format(x="{x}", dim=_axis_arg(x)), x, name, S)

        return OpSpec(name, S, torch_name, 1, ANY, apply, accepts=lambda v: _fdim(v).value > 1,
                      preserves_shape=True)

    return [
        op("softmax", "torch.softmax", "torch.softmax({x}, dim={dim})"),
        op("log_softmax", "torch.nn.functional.log_softmax", "F.log_softmax({x}, dim={dim})"),
        op("softmin", "torch.nn.functional.softmin", "F.softmin({x}, dim={dim})"),
    ]


# --------------------------------------------------------------------------------------------------------
# matmul


def _fitting_width(d: Dim, rng: random.Random, p: SizeProfile) -> int:
    """A new feature width whose [d, width] weight stays within the profile's parameter limit."""
    fits = [w for w in p.features if d.value * w <= p.max_params]
    if not fits:
        raise NotApplicable(f"a [{d.value}, width] weight exceeds {p.max_params} parameters")
    return rng.choice(fits)


def _matmuls() -> list[OpSpec]:
    M = "matmul"

    def linear(bias: bool, name: str) -> OpSpec:
        def apply(b: Builder, x: Value, rng: random.Random, p: SizeProfile) -> Value:
            d = x.shape[-1]
            o = b.param("out_features", _fitting_width(d, rng, p))
            m = b.module("linear", f"nn.Linear({d.expr}, {o.expr}{'' if bias else ', bias=False'})")
            return b.emit(f"x = {m}({{x}})", Value(x.shape[:-1] + (o,), x.layout), name, M)

        return OpSpec(name, M, "torch.nn.Linear", 1, FEATURES, apply)

    def matmul_input(b: Builder, x: Value, rng: random.Random, p: SizeProfile) -> Value:
        d = x.shape[-1]
        o = b.param("proj_size", _fitting_width(d, rng, p))
        w = b.extra_input("w", f"torch.randn({d.expr}, {o.expr})")
        return b.emit(f"x = torch.matmul({{x}}, {w})", Value(x.shape[:-1] + (o,), x.layout), "matmul_input", M)

    def gram(b: Builder, x: Value, rng: random.Random, p: SizeProfile) -> Value:
        if x.layout == "rows":
            return b.emit("x = torch.mm({x}, {x}.t())", Value((x.shape[0], x.shape[0]), "rows"), "gram", M)
        return b.emit("x = torch.bmm({x}, {x}.transpose(1, 2))", Value((x.shape[0], x.shape[1], x.shape[1]), "seq"),
                      "gram", M)

    def bmm_input(b: Builder, x: Value, rng: random.Random, p: SizeProfile) -> Value:
        o = b.param("proj_size", rng.choice(p.features))
        w = b.extra_input("w", f"torch.randn({x.shape[0].expr}, {x.shape[2].expr}, {o.expr})")
        return b.emit(f"x = torch.bmm({{x}}, {w})", Value((x.shape[0], x.shape[1], o), "seq"), "bmm_input", M)

    def bilinear(b: Builder, x: Value, rng: random.Random, p: SizeProfile) -> Value:
        d = x.shape[-1]
        o = b.param("out_features", rng.choice((16, 32, 64)))
        y = _partner(b, x, rng, allow_param=False)
        m = b.module("bilinear", f"nn.Bilinear({d.expr}, {d.expr}, {o.expr})")
        return b.emit(f"x = {m}({{x}}, {y})", Value((x.shape[0], o), "rows"), "bilinear", M)

    def addmm(b: Builder, x: Value, rng: random.Random, p: SizeProfile) -> Value:
        d = x.shape[-1]
        o = b.param("out_features", _fitting_width(d, rng, p))
        w = b.module("weight", f"nn.Parameter(torch.randn({d.expr}, {o.expr}) / {d.expr} ** 0.5)")
        bias = b.module("bias", f"nn.Parameter(torch.zeros({o.expr}))")
        return b.emit(f"x = torch.addmm({bias}, {{x}}, {w})", Value((x.shape[0], o), "rows"), "addmm", M)

    def einsum(b: Builder, x: Value, rng: random.Random, p: SizeProfile) -> Value:
        d = x.shape[-1]
        o = b.param("out_features", _fitting_width(d, rng, p))
        w = b.module("weight", f"nn.Parameter(torch.randn({d.expr}, {o.expr}) / {d.expr} ** 0.5)")
        return b.emit(f'x = torch.einsum("bld,de->ble", {{x}}, {w})', Value(x.shape[:2] + (o,), "seq"), "einsum", M)

    return [
        linear(True, "linear"),
        linear(False, "linear_nobias"),
        OpSpec("matmul_input", M, "torch.matmul", 2, FEATURES, matmul_input),
        OpSpec("gram", M, "torch.bmm", 1, FEATURES, gram,
               accepts=lambda v: v.shape[-2].value <= 512),
        OpSpec("bmm_input", M, "torch.Tensor.bmm", 2, frozenset({"seq"}), bmm_input),
        OpSpec("bilinear", M, "torch.nn.Bilinear", 2, frozenset({"rows"}), bilinear,
               accepts=lambda v: v.shape[-1].value <= 256),
        OpSpec("addmm", M, "torch.addmm", 1, frozenset({"rows"}), addmm),
        OpSpec("einsum", M, "torch.einsum", 1, frozenset({"seq"}), einsum),
    ]


# --------------------------------------------------------------------------------------------------------
# convolution


def _convs() -> list[OpSpec]:
    C = "conv"

    def conv(name: str, torch_name: str, layout: str, nd: int, kind: str) -> OpSpec:
        cls = torch_name.rsplit(".", 1)[1]

        def apply(b: Builder, x: Value, rng: random.Random, p: SizeProfile) -> Value:
            c = x.shape[1]
            spatial = list(x.shape[2:])
            if kind == "depthwise":
                o = c
                ctor = f"nn.{cls}({c.expr}, {c.expr}, kernel_size=3, padding=1, groups={c.expr})"
            else:
                o = b.param("out_channels", rng.choice(p.channels))
                if kind == "same":
                    k = rng.choice([3, 5]) if nd < 3 else 3
                    ctor = f"nn.{cls}({c.expr}, {o.expr}, kernel_size={k}, padding={k // 2})"
                elif kind == "strided":
                    ctor = f"nn.{cls}({c.expr}, {o.expr}, kernel_size=3, stride=2, padding=1)"
                    spatial = [d.ceildiv2() for d in spatial]
                elif kind == "pointwise":
                    ctor = f"nn.{cls}({c.expr}, {o.expr}, kernel_size=1)"
                elif kind == "transpose":
                    ctor = f"nn.{cls}({c.expr}, {o.expr}, kernel_size=2, stride=2)"
                    spatial = [d.times(2) for d in spatial]
                else:
                    raise AssertionError(kind)
            m = b.module("conv", ctor)
            return b.emit(f"x = {m}({{x}})", Value((x.shape[0], o, *spatial), layout), name, C)

        def accepts(v: Value) -> bool:
            return all(d.value >= 2 for d in v.shape[2:])

        return OpSpec(name, C, torch_name, 1, frozenset({layout}), apply, accepts)

    return [
        conv("conv1d", "torch.nn.Conv1d", "ncl", 1, "same"),
        conv("conv2d", "torch.nn.Conv2d", "nchw", 2, "same"),
        conv("conv2d_strided", "torch.nn.Conv2d", "nchw", 2, "strided"),
        conv("conv2d_pointwise", "torch.nn.Conv2d", "nchw", 2, "pointwise"),
        conv("depthwise_conv2d", "torch.nn.Conv2d", "nchw", 2, "depthwise"),
        conv("conv3d", "torch.nn.Conv3d", "ncdhw", 3, "same"),
        conv("conv_transpose1d", "torch.nn.ConvTranspose1d", "ncl", 1, "transpose"),
        conv("conv_transpose2d", "torch.nn.ConvTranspose2d", "nchw", 2, "transpose"),
        conv("conv_transpose3d", "torch.nn.ConvTranspose3d", "ncdhw", 3, "transpose"),
    ]


# --------------------------------------------------------------------------------------------------------
# pooling


def _pools() -> list[OpSpec]:
    P = "pooling"

    def pool(name: str, fn: str, layout: str, extra: str = "") -> OpSpec:
        def apply(b: Builder, x: Value, rng: random.Random, p: SizeProfile) -> Value:
            spatial = [d.floordiv(2) for d in x.shape[2:]]
            return b.emit(f"x = F.{fn}({{x}}, kernel_size=2{extra})", Value((*x.shape[:2], *spatial), layout), name, P)

        return OpSpec(name, P, f"torch.nn.functional.{fn}", 1, frozenset({layout}), apply,
                      accepts=lambda v: all(d.value >= 2 for d in v.shape[2:]))

    def global_pool(name: str, fn: str, layouts: frozenset[str]) -> OpSpec:
        def apply(b: Builder, x: Value, rng: random.Random, p: SizeProfile) -> Value:
            return b.emit(f"x = F.{fn}({{x}}, 1).flatten(1)", Value(x.shape[:2], "rows"), name, P)

        return OpSpec(name, P, f"torch.nn.functional.{fn}", 1, layouts, apply)

    def adaptive_max(b: Builder, x: Value, rng: random.Random, p: SizeProfile) -> Value:
        s = rng.choice([2, 4])
        return b.emit(f"x = F.adaptive_max_pool2d({{x}}, ({s}, {s}))",
                      Value((*x.shape[:2], const(s), const(s)), "nchw"), "adaptive_max_pool2d", P)

    def lp(b: Builder, x: Value, rng: random.Random, p: SizeProfile) -> Value:
        spatial = [d.floordiv(2) for d in x.shape[2:]]
        return b.emit("x = F.lp_pool2d({x}, norm_type=2, kernel_size=2)", Value((*x.shape[:2], *spatial), "nchw"),
                      "lp_pool2d", P)

    return [
        pool("max_pool1d", "max_pool1d", "ncl"),
        pool("avg_pool1d", "avg_pool1d", "ncl"),
        pool("max_pool2d", "max_pool2d", "nchw"),
        pool("avg_pool2d", "avg_pool2d", "nchw"),
        pool("max_pool3d", "max_pool3d", "ncdhw"),
        pool("avg_pool3d", "avg_pool3d", "ncdhw"),
        global_pool("adaptive_avg_pool2d", "adaptive_avg_pool2d", frozenset({"nchw"})),
        global_pool("adaptive_avg_pool1d", "adaptive_avg_pool1d", frozenset({"ncl"})),
        OpSpec("adaptive_max_pool2d", P, "torch.nn.functional.adaptive_max_pool2d", 1, frozenset({"nchw"}),
               adaptive_max, accepts=lambda v: v.shape[2].value >= 4 and v.shape[3].value >= 4),
        OpSpec("lp_pool2d", P, "torch.nn.functional.lp_pool2d", 1, frozenset({"nchw"}), lp,
               accepts=lambda v: v.shape[2].value >= 2 and v.shape[3].value >= 2),
    ]


# --------------------------------------------------------------------------------------------------------
# attention (on seq values [B, L, D])


def _heads(v: Value) -> list[int]:
    d = v.shape[-1].value
    return [h for h in (2, 4, 8) if d % h == 0 and d // h >= 8]


def _attention() -> list[OpSpec]:
    T = "attention"
    seq = frozenset({"seq"})

    def sdpa(causal: bool) -> Callable:
        def apply(b: Builder, x: Value, rng: random.Random, p: SizeProfile) -> Value:
            extra = ", is_causal=True" if causal else ""
            return b.emit(f"x = F.scaled_dot_product_attention({{x}}, {{x}}, {{x}}{extra})", x,
                          "sdpa_causal" if causal else "sdpa", T)

        return apply

    def cross(b: Builder, x: Value, rng: random.Random, p: SizeProfile) -> Value:
        s = b.param("context_len", rng.choice([16, 32, 64]))
        ctx = b.extra_input("context", f"torch.randn({x.shape[0].expr}, {s.expr}, {x.shape[2].expr})")
        return b.emit(f"x = F.scaled_dot_product_attention({{x}}, {ctx}, {ctx})", x, "sdpa_cross", T)

    def mha(b: Builder, x: Value, rng: random.Random, p: SizeProfile) -> Value:
        h = rng.choice(_heads(x))
        m = b.module("attn", f"nn.MultiheadAttention({x.shape[2].expr}, num_heads={h}, batch_first=True)")
        return b.emit(f"x, _ = {m}({{x}}, {{x}}, {{x}}, need_weights=False)", x, "multihead_attention", T)

    def qkv(b: Builder, x: Value, rng: random.Random, p: SizeProfile) -> Value:
        h = rng.choice(_heads(x))
        d = x.shape[2].expr
        m = b.module("qkv", f"nn.Linear({d}, 3 * {d})")
        stmt = (f"q, k, v = {m}({{x}}).chunk(3, dim=-1)\n"
                "b, l, _ = q.shape\n"
                f"q = q.view(b, l, {h}, -1).transpose(1, 2)\n"
                f"k = k.view(b, l, {h}, -1).transpose(1, 2)\n"
                f"v = v.view(b, l, {h}, -1).transpose(1, 2)\n"
                "x = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, l, -1)")
        b._names.update({"q", "k", "v", "b", "l"})
        return b.emit(stmt, x, "qkv_attention", T)

    has_heads = lambda v: bool(_heads(v))  # noqa: E731
    return [
        OpSpec("sdpa", T, "torch.nn.functional.scaled_dot_product_attention", 1, seq, sdpa(False),
               preserves_shape=True),
        OpSpec("sdpa_causal", T, "torch.nn.functional.scaled_dot_product_attention", 1, seq, sdpa(True),
               preserves_shape=True),
        OpSpec("sdpa_cross", T, "torch.nn.functional.scaled_dot_product_attention", 2, seq, cross,
               preserves_shape=True),
        OpSpec("multihead_attention", T, "torch.nn.MultiheadAttention", 1, seq, mha, accepts=has_heads,
               preserves_shape=True),
        OpSpec("qkv_attention", T, "torch.nn.functional.scaled_dot_product_attention", 1, seq, qkv,
               accepts=has_heads, preserves_shape=True),
    ]


# --------------------------------------------------------------------------------------------------------
# scans


def _scans() -> list[OpSpec]:
    S = "scan"
    last_gt1 = lambda v: v.shape[-1].value > 1  # noqa: E731
    return [
        _unary("cumsum", S, "torch.cumsum", "torch.cumsum({x}, dim=-1)", accepts=last_gt1),
        _unary("cumprod", S, "torch.cumprod", "torch.cumprod({x}, dim=-1)", accepts=last_gt1),
        _unary("logcumsumexp", S, "torch.logcumsumexp", "torch.logcumsumexp({x}, dim=-1)", accepts=last_gt1),
        _unary("cummax", S, "torch.cummax", "torch.cummax({x}, dim=-1).values", accepts=last_gt1),
        _unary("cummin", S, "torch.cummin", "torch.cummin({x}, dim=-1).values", accepts=last_gt1),
    ]


# --------------------------------------------------------------------------------------------------------
# losses and distances


def _losses() -> list[OpSpec]:
    L = "loss"
    mats = ANY - {"vec"}

    def loss(name: str, fn: str, target: str, extra: str = "", layouts: frozenset[str] = mats,
             pre: str = "{x}") -> OpSpec:
        def apply(b: Builder, x: Value, rng: random.Random, p: SizeProfile) -> Value:
            t = b.extra_input("target", target.format(shape=shape_expr(x)))
            return b.emit(f"x = F.{fn}({pre}, {t}{extra})", Value((), "scalar"), name, L)

        return OpSpec(name, L, f"torch.nn.functional.{fn}", 2, layouts, apply, terminal=True)

    def cross_entropy(b: Builder, x: Value, rng: random.Random, p: SizeProfile) -> Value:
        t = b.extra_input("target", f"torch.randint(0, {x.shape[1].expr}, ({x.shape[0].expr},))")
        return b.emit(f"x = F.cross_entropy({{x}}, {t})", Value((), "scalar"), "cross_entropy", L)

    def distance(name: str, fn: str, extra: str = "") -> OpSpec:
        def apply(b: Builder, x: Value, rng: random.Random, p: SizeProfile) -> Value:
            y = _partner(b, x, rng, allow_param=False)
            return b.emit(f"x = F.{fn}({{x}}, {y}{extra})", Value((x.shape[0],), "vec"), name, L)

        return OpSpec(name, L, f"torch.nn.functional.{fn}", 2, frozenset({"rows"}), apply)

    return [
        loss("mse_loss", "mse_loss", "torch.randn({shape})"),
        loss("l1_loss", "l1_loss", "torch.randn({shape})"),
        loss("smooth_l1_loss", "smooth_l1_loss", "torch.randn({shape})", ", beta=0.5"),
        loss("huber_loss", "huber_loss", "torch.randn({shape})", ", delta=1.0"),
        loss("bce_with_logits", "binary_cross_entropy_with_logits", "torch.rand({shape})"),
        loss("soft_margin_loss", "soft_margin_loss", "torch.randint(0, 2, ({shape},)).float() * 2 - 1"),
        loss("kl_div", "kl_div", "torch.softmax(torch.randn({shape}), dim=-1)", ', reduction="batchmean"',
             layouts=FEATURES, pre="F.log_softmax({x}, dim=-1)"),
        OpSpec("cross_entropy", L, "torch.nn.functional.cross_entropy", 2, frozenset({"rows"}), cross_entropy,
               terminal=True),
        distance("cosine_similarity", "cosine_similarity", ", dim=-1"),
        distance("pairwise_distance", "pairwise_distance"),
    ]


# --------------------------------------------------------------------------------------------------------
# layout / data movement


def _layouts() -> list[OpSpec]:
    Y = "layout"

    def transpose(b: Builder, x: Value, rng: random.Random, p: SizeProfile) -> Value:
        s = x.shape
        out = Value((s[0], s[2], s[1]), "ncl" if x.layout == "seq" else "seq")
        return b.emit("x = {x}.transpose(1, 2).contiguous()", out, "transpose", Y)

    def pad(b: Builder, x: Value, rng: random.Random, p: SizeProfile) -> Value:
        k = rng.choice([1, 2])
        mode = rng.choice(['', ', mode="reflect"', ', mode="replicate"']) if x.layout in SPATIAL else ""
        shape = list(x.shape)
        if x.layout == "nchw":
            shape[2], shape[3] = shape[2].plus(2 * k), shape[3].plus(2 * k)
            arg = f"({k}, {k}, {k}, {k})"
        else:
            shape[-1] = shape[-1].plus(2 * k)
            arg = f"({k}, {k})"
        return b.emit(f"x = F.pad({{x}}, {arg}{mode})", Value(tuple(shape), x.layout), "pad", Y)

    def pixel_shuffle(b: Builder, x: Value, rng: random.Random, p: SizeProfile) -> Value:
        s = x.shape
        out = Value((s[0], s[1].floordiv(4), s[2].times(2), s[3].times(2)), "nchw")
        return b.emit("x = F.pixel_shuffle({x}, 2)", out, "pixel_shuffle", Y)

    def pixel_unshuffle(b: Builder, x: Value, rng: random.Random, p: SizeProfile) -> Value:
        s = x.shape
        out = Value((s[0], s[1].times(4), s[2].floordiv(2), s[3].floordiv(2)), "nchw")
        return b.emit("x = F.pixel_unshuffle({x}, 2)", out, "pixel_unshuffle", Y)

    def upsample(mode: str) -> Callable:
        def apply(b: Builder, x: Value, rng: random.Random, p: SizeProfile) -> Value:
            out = Value((*x.shape[:2], *(d.times(2) for d in x.shape[2:])), x.layout)
            extra = ", align_corners=False" if mode != "nearest" else ""
            return b.emit(f'x = F.interpolate({{x}}, scale_factor=2, mode="{mode}"{extra})', out,
                          f"upsample_{mode}", Y)

        return apply

    def cat(b: Builder, x: Value, rng: random.Random, p: SizeProfile) -> Value:
        y = _partner(b, x, rng, allow_param=False)
        ax = feature_axis(x)
        shape = list(x.shape)
        shape[ax] = shape[ax].times(2)
        return b.emit(f"x = torch.cat([{{x}}, {y}], dim={_axis_arg(x)})", Value(tuple(shape), x.layout), "cat", Y)

    def flatten(b: Builder, x: Value, rng: random.Random, p: SizeProfile) -> Value:
        d = x.shape[1]
        for e in x.shape[2:]:
            d = d.mul(e)
        return b.emit("x = torch.flatten({x}, 1)", Value((x.shape[0], d), "rows"), "flatten", Y)

    return [
        OpSpec("transpose", Y, "torch.transpose", 1, frozenset({"seq", "ncl"}), transpose),
        _unary("flip", Y, "torch.flip", "torch.flip({x}, dims=[-1])"),
        _unary("roll", Y, "torch.roll", lambda r: f"torch.roll({{x}}, shifts={r.choice([1, 3, -2])}, dims=-1)"),
        OpSpec("pad", Y, "torch.nn.functional.pad", 1, frozenset({"rows", "seq", "ncl", "nchw"}), pad,
               accepts=lambda v: v.shape[-1].value >= 4),
        OpSpec("pixel_shuffle", Y, "torch.nn.functional.pixel_shuffle", 1, frozenset({"nchw"}), pixel_shuffle,
               accepts=lambda v: v.shape[1].value % 4 == 0),
        OpSpec("pixel_unshuffle", Y, "torch.nn.functional.pixel_unshuffle", 1, frozenset({"nchw"}),
               pixel_unshuffle, accepts=lambda v: v.shape[2].value % 2 == 0 and v.shape[3].value % 2 == 0),
        OpSpec("upsample_nearest", Y, "torch.nn.functional.interpolate", 1, SPATIAL, upsample("nearest")),
        OpSpec("upsample_bilinear", Y, "torch.nn.functional.interpolate", 1, frozenset({"nchw"}),
               upsample("bilinear")),
        OpSpec("cat", Y, "torch.cat", 2, ANY - {"vec"}, cat),
        OpSpec("flatten", Y, "torch.flatten", 1, SPATIAL | {"seq"}, flatten),
    ]


REGISTRY: tuple[OpSpec, ...] = tuple(
    _activations() + _elementwise() + _reductions() + _normalizations() + _softmaxes()
    + _matmuls() + _convs() + _pools() + _attention() + _scans() + _losses() + _layouts()
)


def by_name() -> dict[str, OpSpec]:
    """Registry entries by name."""
    return {op.name: op for op in REGISTRY}


def by_category() -> dict[str, list[OpSpec]]:
    out: dict[str, list[OpSpec]] = {}
    for op in REGISTRY:
        out.setdefault(op.category, []).append(op)
    return out


# Start values for each layout: axis hint names and size choices (CPU-sized).
START_DIMS: dict[str, tuple[tuple[str, tuple[int, ...]], ...]] = {
    "rows": (("batch_size", (32, 64, 128, 256)), ("features", (64, 128, 256, 512))),
    "seq": (("batch_size", (2, 4, 8)), ("seq_len", (32, 64, 128)), ("hidden", (32, 64, 128))),
    "ncl": (("batch_size", (4, 8, 16)), ("channels", (8, 16, 32)), ("length", (64, 128, 256))),
    "nchw": (("batch_size", (2, 4, 8)), ("channels", (8, 16)), ("height", (16, 32)), ("width", (16, 32))),
    "ncdhw": (("batch_size", (2, 4)), ("channels", (4, 8)), ("depth", (4, 8)), ("height", (8, 16)),
              ("width", (8, 16))),
}


def start_value(b: Builder, layout: str, rng: random.Random) -> Value:
    """Declare the first input of a graph with fresh shape parameters and return its value."""
    dims = tuple(b.param(hint, rng.choice(choices)) for hint, choices in START_DIMS[layout])
    v = Value(dims, layout)
    return b.start(v, f"torch.randn({shape_expr(v)})")
