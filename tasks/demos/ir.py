"""Translate a reference's forward into a small IR for programmatic demonstrations.

A reference is in the *fused family* when its forward is

    prologue (pointwise)  ->  optional core op  ->  epilogue (pointwise)  ->  return

where pointwise statements combine the inputs, earlier values, learned per-feature / per-channel parameters
(`nn.Parameter`, `nn.PReLU`) and constants with arithmetic and the functions in `FUNCS`, and the core op is one of

  - a row operation along one axis or the trailing axes: sum, mean, amax, amin, logsumexp, vector norm, var,
    std (reductions); softmax, log_softmax, softmin, L2 normalize, LayerNorm, RMSNorm (row normalisations);
  - a scan along the last axis: cumsum, cumprod, cummax, cummin, logcumsumexp;
  - a matrix product: nn.Linear, torch.matmul / mm / bmm with an input or a parameter, torch.addmm,
    torch.einsum("bld,de->ble"), and the Gram products x @ x^T.

`translate(source)` returns a `Program` or raises `Unsupported` naming what falls outside the family. The
code generators live in `tasks.demos.codegen`.
"""

from __future__ import annotations

import ast
import math
from dataclasses import dataclass, field


class Unsupported(ValueError):
    """The reference is outside the fused family (the message says what is outside it)."""


# python function name -> (C helper, [(keyword, default)] of constant arguments after the tensor)
FUNCS: dict[str, tuple[str, list[tuple[str, float | None]]]] = {
    "relu": ("relu_f", []), "relu6": ("relu6_f", []), "silu": ("silu_f", []), "sigmoid": ("sigmoid_f", []),
    "tanh": ("tanhf", []), "hardswish": ("hardswish_f", []), "hardsigmoid": ("hardsigmoid_f", []),
    "mish": ("mish_f", []), "selu": ("selu_f", []), "softsign": ("softsign_f", []),
    "logsigmoid": ("logsigmoid_f", []), "tanhshrink": ("tanhshrink_f", []),
    "softplus": ("softplus_f", [("beta", 1.0), ("threshold", 20.0)]),
    "elu": ("elu_f", [("alpha", 1.0)]), "celu": ("celu_f", [("alpha", 1.0)]),
    "leaky_relu": ("leaky_relu_f", [("negative_slope", 0.01)]),
    "hardtanh": ("hardtanh_f", [("min_val", -1.0), ("max_val", 1.0)]),
    "softshrink": ("softshrink_f", [("lambd", 0.5)]), "hardshrink": ("hardshrink_f", [("lambd", 0.5)]),
    "abs": ("fabsf", []), "neg": ("neg_f", []), "exp": ("expf", []), "log1p": ("log1pf", []),
    "sqrt": ("sqrtf", []), "rsqrt": ("rsqrt_f", []), "square": ("square_f", []), "sin": ("sinf", []),
    "cos": ("cosf", []), "erf": ("erff", []), "atan": ("atanf", []), "reciprocal": ("reciprocal_f", []),
    "log": ("logf", []),
}
BINARY_FUNCS = {"maximum": "fmaxf", "minimum": "fminf"}
METHODS = {"abs", "relu", "sigmoid", "tanh", "exp", "neg", "square", "sqrt"}

REDUCTIONS = ("sum", "mean", "amax", "amin", "logsumexp", "vector_norm", "var", "std")
ROW_NORMS = ("softmax", "log_softmax", "softmin", "normalize", "layer_norm", "rms_norm")
SCANS = {"cumsum": "sum", "cumprod": "prod", "cummax": "max", "cummin": "min", "logcumsumexp": "logaddexp"}


@dataclass
class Param:
    """A learned tensor read elementwise: python expression, and the axis of x it runs along.

    axis None: torch broadcasting (aligned to the right of x); an int: that axis of x (nn.PReLU uses 1).
    """

    expr: str
    axis: int | None = None


@dataclass
class Step:
    """`target = expr`: C expression with `{name}` placeholders for the scalars it reads."""

    target: str
    expr: str
    uses: list[str]
    line: str = ""  # the reference's statement, as written


@dataclass
class RowOp:
    """A reduction / normalisation along `axis` ("last", ("axis", k) or ("from", k): the axes k..end)."""

    kind: str
    source: str
    target: str
    axis: tuple
    keepdim: bool = False
    eps: float = 0.0
    weight: str = ""  # python expressions of LayerNorm / RMSNorm affine parameters ("" for none)
    bias: str = ""
    line: str = ""  # the reference's statement, as written


@dataclass
class Scan:
    kind: str
    source: str
    target: str
    line: str = ""  # the reference's statement, as written


@dataclass
class Gemm:
    """C[b, m, n] = sum_k A[b, m, k] * B[b, k, n] (+ bias[n]).

    a: name of the A operand (a value of the forward); b: python expression of the B tensor, or "" for a Gram
    product (B = A^T); b_layout: "kn" (B stored [K, N]) or "nk" (stored [N, K], e.g. a Linear weight);
    batched: 3-D operands with a batch axis; bias: python expression or "".
    """

    a: str
    target: str
    b: str
    b_layout: str
    batched: bool = False
    bias: str = ""
    line: str = ""  # the reference's statement, as written


@dataclass
class Program:
    inputs: list[str]
    init_source: str
    params: dict[str, Param] = field(default_factory=dict)
    floats: dict[str, str] = field(default_factory=dict)
    prologue: list[Step] = field(default_factory=list)
    core: RowOp | Scan | Gemm | None = None
    epilogue: list[Step] = field(default_factory=list)
    result: str = ""

    @property
    def core_kind(self) -> str:
        return {RowOp: "row", Scan: "scan", Gemm: "gemm", type(None): "pointwise"}[type(self.core)]


def const(node: ast.AST) -> float | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return float(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        v = const(node.operand)
        return -v if v is not None else None
    return None


def lit(v: float) -> str:
    """A C float literal."""
    if math.isinf(v):
        return "INFINITY" if v > 0 else "-INFINITY"
    r = repr(float(v))
    return r + "f" if ("e" in r or "." in r) else r + ".0f"


def _fname(func: ast.AST) -> str | None:
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id in ("torch", "F"):
        return func.attr
    if (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Attribute)
            and isinstance(func.value.value, ast.Name) and func.value.value.id == "torch"
            and func.value.attr in ("linalg", "special")):
        return func.attr
    return None


def _self_attr(node: ast.AST) -> str | None:
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
        return node.attr
    return None


@dataclass
class _Init:
    """What Model.__init__ builds: parameter names, number attributes, modules by kind."""

    params: set[str] = field(default_factory=set)
    floats: set[str] = field(default_factory=set)
    modules: dict[str, tuple[str, ast.Call]] = field(default_factory=dict)  # attr -> (class name, ctor call)


_MODULES = {"PReLU", "LayerNorm", "RMSNorm", "Linear"}


def _read_init(init: ast.FunctionDef) -> _Init:
    out = _Init()
    args = {a.arg for a in init.args.args[1:]}
    for st in init.body:
        if isinstance(st, ast.Expr) and isinstance(st.value, (ast.Call, ast.Constant)):
            continue  # super().__init__() / docstring
        if not (isinstance(st, ast.Assign) and len(st.targets) == 1 and _self_attr(st.targets[0])):
            raise Unsupported(f"__init__ statement {ast.unparse(st)[:60]}")
        name = _self_attr(st.targets[0])
        v = st.value
        if isinstance(v, ast.Call) and isinstance(v.func, ast.Attribute) and v.func.attr == "Parameter":
            out.params.add(name)  # type: ignore[arg-type]
        elif isinstance(v, ast.Call) and isinstance(v.func, ast.Attribute) and v.func.attr in _MODULES:
            out.modules[name] = (v.func.attr, v)  # type: ignore[index]
        elif (isinstance(v, ast.Name) and v.id in args) or const(v) is not None:
            out.floats.add(name)  # type: ignore[arg-type]
        else:
            raise Unsupported(f"__init__ builds {ast.unparse(v)[:60]}")
    return out


class _Translator:
    def __init__(self, prog: Program, init: _Init):
        self.prog, self.init = prog, init
        self.names: set[str] = set(prog.inputs)
        self.assigned: set[str] = set()
        self.phase = "prologue"

    # -- pointwise expressions -------------------------------------------------------------------------
    def _use(self, uses: list[str], n: str) -> str:
        if n not in uses:
            uses.append(n)
        return "{" + n + "}"

    def expr(self, node: ast.AST, uses: list[str]) -> str:
        v = const(node)
        if v is not None:
            return lit(v)
        if isinstance(node, ast.Name):
            if node.id not in self.names:
                raise Unsupported(f"{node.id} is not available here")
            return self._use(uses, node.id)
        attr = _self_attr(node)
        if attr is not None:
            if attr in self.init.params:
                key = f"self_{attr}"
                self.prog.params.setdefault(key, Param(f"self.{attr}"))
                return self._use(uses, key)
            if attr in self.init.floats:
                key = f"self_{attr}"
                self.prog.floats.setdefault(key, f"float(self.{attr})")
                return self._use(uses, key)
            raise Unsupported(f"self.{attr} is not a parameter or a number")
        if isinstance(node, ast.BinOp):
            a, b = self.expr(node.left, uses), self.expr(node.right, uses)
            if isinstance(node.op, ast.Pow):
                e = const(node.right)
                if e in (2.0, 3.0):
                    return "(" + " * ".join([a] * int(e)) + ")"
                if e == 0.5:
                    return f"sqrtf({a})"
                raise Unsupported("power other than 2, 3 or 0.5")
            ops = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}
            if type(node.op) not in ops:
                raise Unsupported(f"operator {type(node.op).__name__}")
            return f"({a} {ops[type(node.op)]} {b})"
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return f"(-{self.expr(node.operand, uses)})"
        if isinstance(node, ast.Compare) and len(node.ops) == 1:
            ops = {ast.Gt: ">", ast.Lt: "<", ast.GtE: ">=", ast.LtE: "<="}
            if type(node.ops[0]) not in ops:
                raise Unsupported("comparison")
            return f"({self.expr(node.left, uses)} {ops[type(node.ops[0])]} {self.expr(node.comparators[0], uses)})"
        if isinstance(node, ast.Call):
            return self._call(node, uses)
        raise Unsupported(f"expression {ast.unparse(node)[:60]}")

    def _consts(self, node: ast.Call, spec: list[tuple[str, float | None]], first: int = 1) -> list[str]:
        vals: list[float | None] = [d for _, d in spec]
        names = [k for k, _ in spec]
        for i, a in enumerate(node.args[first:]):
            if i >= len(spec):
                raise Unsupported("too many arguments")
            vals[i] = const(a)
        for kw in node.keywords:
            if kw.arg not in names:
                raise Unsupported(f"keyword {kw.arg}")
            vals[names.index(kw.arg)] = const(kw.value)
        if any(v is None for v in vals):
            raise Unsupported("non-constant argument")
        return [lit(v) for v in vals]  # type: ignore[arg-type]

    def _call(self, node: ast.Call, uses: list[str]) -> str:
        f = node.func
        mod = _self_attr(f)
        if mod is not None and mod in self.init.modules and self.init.modules[mod][0] == "PReLU":
            key = f"self_{mod}_weight"
            self.prog.params.setdefault(key, Param(f"self.{mod}.weight", axis=1))
            return f"prelu_f({self.expr(node.args[0], uses)}, {self._use(uses, key)})"
        if isinstance(f, ast.Attribute) and f.attr in METHODS and _fname(f) is None and _self_attr(f) is None:
            if node.args or node.keywords:
                raise Unsupported("method arguments")
            return f"{FUNCS[f.attr][0]}({self.expr(f.value, uses)})"
        name = _fname(f)
        if name is None:
            raise Unsupported(f"call of {ast.unparse(f)[:40]}")
        if name == "gelu":
            approx = next((k.value.value for k in node.keywords if k.arg == "approximate"), "none")
            return f"{'gelu_tanh_f' if approx == 'tanh' else 'gelu_erf_f'}({self.expr(node.args[0], uses)})"
        if name in FUNCS:
            helper, spec = FUNCS[name]
            return f"{helper}({', '.join([self.expr(node.args[0], uses)] + self._consts(node, spec))})"
        if name in BINARY_FUNCS:
            return f"{BINARY_FUNCS[name]}({self.expr(node.args[0], uses)}, {self.expr(node.args[1], uses)})"
        if name == "clamp":
            lo, hi = self._consts(node, [("min", -math.inf), ("max", math.inf)])
            return f"fminf(fmaxf({self.expr(node.args[0], uses)}, {lo}), {hi})"
        if name == "where":
            a, b, c = (self.expr(x, uses) for x in node.args[:3])
            return f"({a} ? {b} : {c})"
        if name == "lerp":
            a, b = self.expr(node.args[0], uses), self.expr(node.args[1], uses)
            w = const(node.args[2])
            if w is None:
                raise Unsupported("lerp weight")
            return f"({a} + {lit(w)} * ({b} - {a}))"
        if name == "addcmul":
            a, b, c = (self.expr(x, uses) for x in node.args[:3])
            (v,) = self._consts(node, [("value", 1.0)], first=3)
            return f"({a} + {v} * {b} * {c})"
        if name == "pow":
            e = const(node.args[1])
            if e in (2.0, 3.0):
                a = self.expr(node.args[0], uses)
                return "(" + " * ".join([a] * int(e)) + ")"
            raise Unsupported("pow exponent")
        raise Unsupported(f"function {name}")

    # -- core ops --------------------------------------------------------------------------------------
    def _src_name(self, node: ast.AST) -> str:
        if not isinstance(node, ast.Name) or node.id not in self.names:
            raise Unsupported("core op on an expression (assign it to a name first)")
        return node.id

    def core(self, target: str, node: ast.AST) -> RowOp | Scan | Gemm | None:
        values = False
        if isinstance(node, ast.Attribute) and node.attr == "values" and isinstance(node.value, ast.Call):
            node, values = node.value, True
        if not isinstance(node, ast.Call):
            return None
        mod = _self_attr(node.func)
        if mod is not None and mod in self.init.modules:
            kind, ctor = self.init.modules[mod]
            if kind == "Linear":
                bias = next((k.value for k in ctor.keywords if k.arg == "bias"), None)
                has_bias = not (isinstance(bias, ast.Constant) and bias.value is False)
                return Gemm(self._src_name(node.args[0]), target, f"self.{mod}.weight", "nk",
                            bias=f"self.{mod}.bias" if has_bias else "")
            if kind in ("LayerNorm", "RMSNorm"):
                return self._norm_module(kind, mod, ctor, target, node)
            return None
        name = _fname(node.func)
        if name == "max" and values:
            name = "amax"
        if name in ("cummax", "cummin") and not values:
            raise Unsupported(f"{name} without .values")
        if name in REDUCTIONS or name in ("softmax", "log_softmax", "softmin", "normalize"):
            return self._row(name, target, node)
        if name in SCANS:
            kw = {k.arg: k.value for k in node.keywords}
            dim = kw.get("dim", node.args[1] if len(node.args) > 1 else None)
            if dim is None or const(dim) != -1.0:
                raise Unsupported(f"{name} not over the last axis")
            return Scan(name, self._src_name(node.args[0]), target)
        if name in ("matmul", "mm", "bmm", "einsum", "addmm"):
            return self._gemm(name, target, node)
        return None

    def _norm_module(self, kind: str, mod: str, ctor: ast.Call, target: str, node: ast.Call) -> RowOp:
        shape = ctor.args[0] if ctor.args else None
        n_axes = len(shape.elts) if isinstance(shape, (ast.List, ast.Tuple)) else 1
        kw = {k.arg: k.value for k in ctor.keywords}
        if kind == "LayerNorm":
            eps = const(kw["eps"]) if "eps" in kw else 1e-5
            affine = not (isinstance(kw.get("elementwise_affine"), ast.Constant) and not kw["elementwise_affine"].value)
            weight, bias = (f"self.{mod}.weight", f"self.{mod}.bias") if affine else ("", "")
            op = "layer_norm"
        else:
            eps = const(kw["eps"]) if "eps" in kw and const(kw["eps"]) is not None else 1.1920928955078125e-07
            weight, bias, op = f"self.{mod}.weight", "", "rms_norm"
        axis = ("last",) if n_axes == 1 else ("from", -n_axes)
        return RowOp(op, self._src_name(node.args[0]), target, axis, eps=float(eps), weight=weight, bias=bias)

    def _row(self, name: str, target: str, node: ast.Call) -> RowOp:
        arg = node.args[0] if node.args else None
        from_flatten = False
        if (isinstance(arg, ast.Call) and isinstance(arg.func, ast.Attribute) and arg.func.attr == "flatten"
                and len(arg.args) == 1 and const(arg.args[0]) == 2.0):
            arg, from_flatten = arg.func.value, True
        src = self._src_name(arg)  # type: ignore[arg-type]
        kw = {k.arg: k.value for k in node.keywords}
        if "correction" in kw or "unbiased" in kw:
            raise Unsupported("var/std options")
        if name == "normalize" and "p" in kw and const(kw["p"]) != 2.0:
            raise Unsupported("normalize with p != 2")
        dim = kw.get("dim", node.args[1] if len(node.args) > 1 else None)
        keepdim = bool(isinstance(kw.get("keepdim"), ast.Constant) and kw["keepdim"].value)
        if dim is None:
            raise Unsupported(f"{name} without dim")
        d = const(dim)
        if from_flatten:
            if d != -1.0:
                raise Unsupported("flatten(2) with a dim other than -1")
            axis: tuple = ("from", 2)
        elif d == -1.0:
            axis = ("last",)
        elif d is not None and d >= 1:
            axis = ("axis", int(d))
        elif isinstance(dim, ast.Tuple) and all(const(e) is not None for e in dim.elts):
            axes = [int(const(e)) for e in dim.elts]  # type: ignore[arg-type]
            if axes[0] < 1 or axes != list(range(axes[0], axes[0] + len(axes))):
                raise Unsupported("reduction axes are not consecutive")
            axis = ("from", axes[0])  # must be the trailing axes: checked at run time by the solution's shapes
        else:
            raise Unsupported(f"{name} over dim {ast.unparse(dim)}")
        if keepdim and name not in REDUCTIONS:
            raise Unsupported("keepdim on a normalisation")
        return RowOp(name, src, target, axis, keepdim=keepdim, eps=1e-12 if name == "normalize" else 0.0)

    def _gemm(self, name: str, target: str, node: ast.Call) -> Gemm:
        args = node.args
        if name == "einsum":
            if not (isinstance(args[0], ast.Constant) and args[0].value.replace(" ", "") == "bld,de->ble"):
                raise Unsupported("einsum equation")
            w = _self_attr(args[2])
            if w not in self.init.params:
                raise Unsupported("einsum weight")
            return Gemm(self._src_name(args[1]), target, f"self.{w}", "kn")
        if name == "addmm":
            bias, a, w = args[0], args[1], args[2]
            if _self_attr(bias) not in self.init.params or _self_attr(w) not in self.init.params:
                raise Unsupported("addmm operands")
            return Gemm(self._src_name(a), target, f"self.{_self_attr(w)}", "kn", bias=f"self.{_self_attr(bias)}")
        a, b = args[0], args[1]
        src = self._src_name(a)
        batched = name == "bmm"
        # Gram products: x @ x.t() / x.transpose(1, 2)
        if (isinstance(b, ast.Call) and isinstance(b.func, ast.Attribute) and isinstance(b.func.value, ast.Name)
                and b.func.value.id == src and b.func.attr in ("t", "transpose")):
            return Gemm(src, target, "", "nk", batched=batched)
        if isinstance(b, ast.Name) and b.id in self.prog.inputs and b.id in self.names and b.id not in self.assigned:
            return Gemm(src, target, b.id, "kn", batched=batched)
        w = _self_attr(b)
        if w in self.init.params:
            return Gemm(src, target, f"self.{w}", "kn", batched=batched)
        raise Unsupported(f"{name} operand {ast.unparse(b)[:40]}")

    # -- statements ------------------------------------------------------------------------------------
    def statement(self, target: str, value: ast.AST, line: str = "") -> None:
        core = self.core(target, value)
        if core is not None:
            core.line = line
            if self.phase != "prologue":
                raise Unsupported("more than one core op")
            if isinstance(core, Gemm) and core.b in self.prog.inputs and core.b == core.a:
                raise Unsupported("matmul of an input with itself")
            self.prog.core = core
            self.phase = "epilogue"
            self.assigned.add(target)
            keeps_shape = isinstance(core, Scan) or (isinstance(core, RowOp) and core.kind in ROW_NORMS)
            self.names = {target} | ({n for n in self.prog.inputs if n != getattr(core, "b", None)} if keeps_shape else set())
            return
        uses: list[str] = []
        e = self.expr(value, uses)
        step = Step(target, e, uses, line)
        (self.prog.prologue if self.phase == "prologue" else self.prog.epilogue).append(step)
        self.names.add(target)
        self.assigned.add(target)


def translate(source: str) -> Program:
    """The fused-family IR of a reference (see the module docstring). Raises Unsupported."""
    tree = ast.parse(source)
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Model"), None)
    if cls is None:
        raise Unsupported("no Model")
    init = next((f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)
    fwd = next((f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "forward"), None)
    if init is None or fwd is None:
        raise Unsupported("Model needs __init__ and forward")
    info = _read_init(init)
    prog = Program(inputs=[a.arg for a in fwd.args.args[1:]], init_source=ast.unparse(init))
    tr = _Translator(prog, info)
    body = list(fwd.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    for st in body:
        if isinstance(st, ast.Return):
            if isinstance(st.value, ast.Name) and st.value.id in tr.names:
                prog.result = st.value.id
            elif st.value is not None and not isinstance(st.value, (ast.Tuple, ast.List, ast.Dict)):
                tr.statement("result", st.value, _line(source, st))
                prog.result = "result"
            else:
                raise Unsupported("return of several values")
            if prog.result not in tr.assigned:
                raise Unsupported("returns an input unchanged")
            return _check(prog)
        if isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.targets[0], ast.Name):
            tr.statement(st.targets[0].id, st.value, _line(source, st))
        elif (isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.targets[0], ast.Tuple)):
            raise Unsupported("tuple assignment")
        else:
            raise Unsupported(f"statement {ast.unparse(st)[:60]}")
    raise Unsupported("forward does not end in return")


def _line(source: str, st: ast.stmt) -> str:
    """A statement's text as the reference writes it (one line; ast.unparse when the segment is unavailable)."""
    seg = ast.get_source_segment(source, st) or ast.unparse(st)
    return " ".join(seg.split())


def _check(prog: Program) -> Program:
    if not prog.prologue and prog.core is None and not prog.epilogue:
        raise Unsupported("nothing to compute")
    return prog
