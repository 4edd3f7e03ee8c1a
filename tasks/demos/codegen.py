"""Render a fused-family program (tasks.demos.ir) as a solution in the cpu or cubin format.

Two variants of different speed (sandbox/FORMATS.md for the formats):

  naive  one kernel per statement with intermediate tensors; the core op is a plain loop nest (cpu: one thread,
         triple-loop GEMM; cubin: one thread per element / per row / per output). As many passes over memory as
         eager or more: slower than eager.
  fused  the prologue, the core op and the epilogue in as few kernels as the data allow: one pass for
         pointwise chains, one kernel per row for row ops and scans (cpu: OpenMP over rows; cubin: one block
         per row with a shared-memory tree reduction / two-level scan), a cache-friendly GEMM with the bias and
         epilogue applied at the store (cpu: OpenMP, loop order chosen by B's layout; cubin: 16x16 shared-memory
         tiles). A non-empty GEMM prologue is materialised first by one fused pointwise kernel.

Both include the sandbox's helper header (`#include "cuda_agent.h"`, sandbox/include: the scalar activations,
`block_reduce` under nvcc, the branch-free vectorisable math on the cpu) rather than carrying a prelude of their
own; the naive cpu kernels keep libm's math (`#define CA_LIBM_MATH` before the include). model_new.py takes the
shape helpers `bcast` and `row_geometry` from sandbox.runtime.

`render(program, fmt, variant)` returns the solution's files: `model_new.py` and one kernel file.
"""

from __future__ import annotations

import textwrap

from tasks.demos.ir import Gemm, Program, RowOp, Scan, Step, lit

FORMATS = ("cpu", "cubin")
VARIANTS = ("naive", "fused")

_SCAN_OPS = {  # kind -> (C combine of (acc, v), identity)
    "cumsum": ("({a} + {b})", "0.0f"), "cumprod": ("({a} * {b})", "1.0f"), "cummax": ("fmaxf({a}, {b})", "-INFINITY"),
    "cummin": ("fminf({a}, {b})", "INFINITY"), "logcumsumexp": ("logaddexp_f({a}, {b})", "-INFINITY"),
}

# Row operations as passes: (variable, combine: sum|max|min, term over s and earlier variables, finish or None);
# then per-row values computed once after the passes; then the reduced value (reductions) or the per-element
# output (normalisations).
_ROW_PASSES = {
    "sum": ([("a", "sum", "s", None)], [], "a", None),
    "mean": ([("a", "sum", "s", None)], [], "a / (float)cols", None),
    "amax": ([("a", "max", "s", None)], [], "a", None),
    "amin": ([("a", "min", "s", None)], [], "a", None),
    "vector_norm": ([("a", "sum", "s * s", None)], [], "sqrtf(a)", None),
    "logsumexp": ([("m", "max", "s", None), ("a", "sum", "expf(s - m)", None)], [], "m + logf(a)", None),
    "var": ([("mu", "sum", "s", "mu / (float)cols"), ("a", "sum", "(s - mu) * (s - mu)", None)], [],
            "a / (float)(cols - 1)", None),
    "std": ([("mu", "sum", "s", "mu / (float)cols"), ("a", "sum", "(s - mu) * (s - mu)", None)], [],
            "sqrtf(a / (float)(cols - 1))", None),
    "softmax": ([("m", "max", "s", None), ("a", "sum", "expf(s - m)", None)], [("rs", "1.0f / a")], None,
                "expf(s - m) * rs"),
    "softmin": ([("m", "max", "-s", None), ("a", "sum", "expf(-s - m)", None)], [("rs", "1.0f / a")], None,
                "expf(-s - m) * rs"),
    "log_softmax": ([("m", "max", "s", None), ("a", "sum", "expf(s - m)", None)], [("lse", "m + logf(a)")], None,
                    "s - lse"),
    "normalize": ([("a", "sum", "s * s", None)], [("rs", "1.0f / fmaxf(sqrtf(a), EPS)")], None, "s * rs"),
    "layer_norm": ([("mu", "sum", "s", "mu / (float)cols"), ("a", "sum", "(s - mu) * (s - mu)", None)],
                   [("rs", "1.0f / sqrtf(a / (float)cols + EPS)")], None, "(s - mu) * rs * W + B"),
    "rms_norm": ([("a", "sum", "s * s", None)], [("rs", "1.0f / sqrtf(a / (float)cols + EPS)")], None, "s * rs * W"),
}
_COMBINE_CODE = {"sum": 0, "max": 1, "min": 2}
_INIT = {"sum": "0.0f", "max": "-INFINITY", "min": "INFINITY"}


def _prelude(fmt: str, vector_math: bool = False) -> str:
    """The kernel file's first lines: the sandbox's helper header (sandbox/include/cuda_agent.h: DEV, the scalar
    activations, block_reduce under nvcc, the cpu's vectorisable math). vector_math False keeps libm's math on
    the cpu (the naive variant's scalar calls)."""
    if fmt == "cpu" and not vector_math:
        return '#define CA_LIBM_MATH\n#include "cuda_agent.h"\n'
    return '#include "cuda_agent.h"\n'


def _kernel_decl(fmt: str, name: str, args: list[str]) -> str:
    q = '__global__ ' if fmt == "cubin" else ""
    return f'extern "C" {q}void {name}({", ".join(args)})'


class _Scope:
    """Arguments and per-element loads of the scalars one expression group reads."""

    def __init__(self, prog: Program, phase: str):
        self.prog, self.phase = prog, phase
        self.inputs: list[str] = []
        self.params: list[str] = []
        self.floats: list[str] = []

    def need(self, names: list[str], local: set[str]) -> None:
        for n in names:
            if n in local:
                continue
            if n in self.prog.params:
                if n not in self.params:
                    self.params.append(n)
            elif n in self.prog.floats:
                if n not in self.floats:
                    self.floats.append(n)
            elif n in self.prog.inputs:
                if n not in self.inputs:
                    self.inputs.append(n)

    def c_args(self) -> list[str]:
        sfx = self.phase[0]
        out = [f"const float* __restrict__ in_{n}_{sfx}" for n in self.inputs]
        for p in self.params:
            out += [f"const float* __restrict__ {p}_{sfx}", f"long long {p}_count_{sfx}", f"long long {p}_inner_{sfx}"]
        out += [f"float {f}" for f in self.floats]
        return out

    def c_call(self) -> list[str]:
        sfx = self.phase[0]
        out = [f"in_{n}_{sfx}" for n in self.inputs]
        for p in self.params:
            out += [f"{p}_{sfx}", f"{p}_count_{sfx}", f"{p}_inner_{sfx}"]
        return out + list(self.floats)

    def py_args(self, ref: str) -> list[str]:
        """Python launch arguments; `ref` is the tensor whose index space the group runs over."""
        out = list(self.inputs)
        for p in self.params:
            par = self.prog.params[p]
            out += [par.expr, _bcast_call(par.expr, ref, par.axis)]
        return out + [self.prog.floats[f] for f in self.floats]


def _steps_code(steps: list[Step], env: dict[str, str], scope: _Scope, idx: str, pidx: bool = False) -> list[str]:
    """C lines computing the steps (SSA: each step a new variable); updates env.

    pidx: the (single) parameter is read at the index passed in as `pidx` instead of (i / inner) % count, so
    the caller's loops can avoid a 64-bit division per element (it blocks vectorisation).
    """
    lines = []
    sfx = scope.phase[0]
    loaded: set[str] = set()
    for st in steps:
        for u in st.uses:
            if u in env or u in loaded:
                continue
            if u in scope.prog.params and pidx:
                lines.append(f"float {u} = {u}_{sfx}[pidx];")
            elif u in scope.prog.params:
                lines.append(f"float {u} = {u}_{sfx}[({idx} / {u}_inner_{sfx}) % {u}_count_{sfx}];")
            elif u in scope.prog.inputs:
                lines.append(f"float in_{u} = in_{u}_{sfx}[{idx}];")
                env[u] = f"in_{u}"
                continue
            loaded.add(u)
    k = len([v for v in env.values() if v.startswith("v")])
    for st in steps:
        binding = {u: env.get(u, u) for u in st.uses}
        var = f"v{k}"
        k += 1
        lines.append(f"float {var} = {st.expr.format_map(binding)};")
        env[st.target] = var
    return lines


def _value_fn(fmt: str, name: str, prog: Program, steps: list[Step], want: str, phase: str,
              core_var: str | None, pidx: bool = False) -> tuple[str, _Scope]:
    """A device/host function computing `want` at element index i from the loads and steps of one phase.

    pidx: take the single parameter's index as a second argument (see _steps_code).
    """
    scope = _Scope(prog, phase)
    local = {core_var} if core_var else set()
    for st in steps:
        scope.need(st.uses, local)
        local.add(st.target)
    if want not in local and want != core_var:
        scope.need([want], set())
    env: dict[str, str] = {}
    pidx = pidx and len(scope.params) == 1
    args = ["long long i"] + (["long long pidx"] if pidx else []) + ([f"float {core_var}_in"] if core_var else []) \
        + scope.c_args()
    body = []
    if core_var:
        env[core_var] = f"{core_var}_in"
    body += _steps_code(steps, env, scope, "i", pidx)
    if want not in env:
        if want in prog.inputs:
            body.append(f"float in_{want} = in_{want}_{phase[0]}[i];")
            env[want] = f"in_{want}"
    body.append(f"return {env[want]};")
    fn = f"DEV float {name}({', '.join(args)}) {{\n" + textwrap.indent("\n".join(body), "    ") + "\n}\n"
    return fn, scope


# ------------------------------------------------------------------------------------------------ model_new.py

_PY_HEAD = """import torch
import torch.nn as nn

from sandbox.runtime import {imports}

K = load_kernels()
"""


def _bcast_call(expr: str, ref: str, axis: int | None) -> str:
    """The `p_count, p_inner` launch arguments of a parameter broadcast over `ref` (sandbox.runtime.bcast)."""
    return f"*bcast({expr}, {ref}" + (f", {axis})" if axis is not None else ")")


def _row_dim(core: RowOp) -> str:
    """The `dim` argument of sandbox.runtime.row_geometry for the row op's axes."""
    if core.axis[0] == "last":
        return "-1"
    if core.axis[0] == "axis":
        return str(core.axis[1])
    return f"({core.axis[1]}, -1)"


def _py_model(prog: Program, forward_body: list[str]) -> str:
    init = prog.init_source.replace("def __init__", "def __init__", 1)
    args = ", ".join(["self"] + prog.inputs)
    body = [f"{n} = {n}.contiguous()" for n in prog.inputs] + forward_body
    used = "\n".join(body)
    imports = ", ".join(n for n in ("bcast", "load_kernels", "row_geometry") if n == "load_kernels" or f"{n}(" in used)
    return (_PY_HEAD.format(imports=imports) + "\n\nclass ModelNew(nn.Module):\n" + textwrap.indent(init, "    ")
            + "\n\n" + f"    def forward({args}):\n" + textwrap.indent("\n".join(body), "        ") + "\n")


def _launch(fmt: str, name: str, args: list[str], grid: str | None = None, block: str = "256") -> str:
    call = f"K.{name}({', '.join(args)}"
    if fmt == "cubin":
        call += f", grid=({grid},), block=({block},)"
    return call + ")"


def _shape_ref(prog: Program) -> str:
    """A forward input with the shape of the prologue's index space."""
    src = getattr(prog.core, "source", None) or getattr(prog.core, "a", None)
    for st in prog.prologue:
        for u in st.uses:
            if u in prog.inputs:
                return u
    if src in prog.inputs:
        return src
    return prog.inputs[0]


# ------------------------------------------------------------------------------------------------ fused variant


def _fused(prog: Program, fmt: str) -> dict[str, str]:
    core = prog.core
    ref = _shape_ref(prog)
    cu = fmt == "cubin"
    src: list[str] = [_prelude(fmt, vector_math=True)]
    py: list[str] = []
    if core is None:
        one_param = fmt == "cpu" and len({u for st in prog.prologue for u in st.uses if u in prog.params}) == 1
        fn, scope = _value_fn(fmt, "pro", prog, prog.prologue, prog.result, "prologue", None, pidx=one_param)
        src.append(fn)
        args = scope.c_args() + ["float* __restrict__ out", "long long n"]
        call = ", ".join(scope.c_call())
        if one_param:
            # Walk the parameter's broadcast structure (blocks x count x inner) so that its index is a loop
            # counter: no per-element division, and the innermost loop vectorises.
            p = scope.params[0]
            body = f"""long long cnt = {p}_count_p, inn = {p}_inner_p;
long long blocks = n / (cnt * inn);
if (inn == 1) {{
#pragma omp parallel for schedule(static)
    for (long long o = 0; o < blocks; ++o) {{
#pragma omp simd
        for (long long c = 0; c < cnt; ++c) out[o * cnt + c] = pro(o * cnt + c, c, {call});
    }}
}} else {{
#pragma omp parallel for collapse(2) schedule(static)
    for (long long o = 0; o < blocks; ++o)
        for (long long c = 0; c < cnt; ++c) {{
            long long base = (o * cnt + c) * inn;
#pragma omp simd
            for (long long j = 0; j < inn; ++j) out[base + j] = pro(base + j, c, {call});
        }}
}}"""
            src.append(_kernel_decl(fmt, "fused_forward", args) + " {\n" + textwrap.indent(body, "    ") + "\n}\n")
        else:
            loop = ("for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; "
                    "i += (long long)gridDim.x * blockDim.x)" if cu else
                    "#pragma omp parallel for simd schedule(static)\n    for (long long i = 0; i < n; ++i)")
            src.append(_kernel_decl(fmt, "fused_forward", args) + " {\n    " + loop + "\n        out[i] = pro(i, "
                       + call + ");\n}\n")
        py += [f"out = torch.empty_like({ref})", f"n = out.numel()",
               _launch(fmt, "fused_forward", scope.py_args(ref) + ["out", "n"], "min((n + 255) // 256, 65535)"),
               "return out"]
    elif isinstance(core, RowOp):
        fn, pscope = _value_fn(fmt, "pro", prog, prog.prologue, core.source, "prologue", None)
        efn, escope = _value_fn(fmt, "epi", prog, prog.epilogue, prog.result, "epilogue", core.target)
        src += [fn, efn]
        src.append(_row_kernel_fused(fmt, core, pscope, escope))
        reduces = core.kind not in ("softmax", "log_softmax", "softmin", "normalize", "layer_norm", "rms_norm")
        py += [f"outer, cols, inner, out_shape = row_geometry({ref}.shape, {_row_dim(core)}, {core.keepdim}, "
               f"{reduces})",
               f"out = torch.empty(out_shape, dtype={ref}.dtype, device={ref}.device)"]
        aff = [a for a in (core.weight, core.bias) if a]
        args = pscope.py_args(ref) + escope.py_args("out") + aff + ["out", "outer", "cols", "inner"]
        py += [_launch(fmt, "row_fused", args, "outer * inner"), "return out"]
    elif isinstance(core, Scan):
        fn, pscope = _value_fn(fmt, "pro", prog, prog.prologue, core.source, "prologue", None)
        efn, escope = _value_fn(fmt, "epi", prog, prog.epilogue, prog.result, "epilogue", core.target)
        src += [fn, efn, _scan_kernel_fused(fmt, core, pscope, escope)]
        py += [f"out = torch.empty_like({ref})", f"cols = {ref}.shape[-1]", "rows = out.numel() // cols",
               _launch(fmt, "scan_fused", pscope.py_args(ref) + escope.py_args("out") + ["out", "rows", "cols"],
                       "rows"), "return out"]
    else:
        assert isinstance(core, Gemm)
        py += _gemm_fused(prog, core, fmt, src)
    return {"model_new.py": _py_model(prog, py), f"kernels/fused.{'cu' if cu else 'cpp'}": "\n".join(src)}


def _affine_args(core: RowOp) -> list[str]:
    out = []
    if core.weight:
        out.append("const float* __restrict__ ln_w")
    if core.bias:
        out.append("const float* __restrict__ ln_b")
    return out


def _row_final(core: RowOp) -> tuple[list, str | None, str | None, list]:
    """(passes, reduced value, per-element output, per-row values) with constants and affine terms filled in."""
    passes, post, red, elem = _ROW_PASSES[core.kind]
    post = [(v, e.replace("EPS", lit(core.eps))) for v, e in post]
    if elem is not None:
        elem = elem.replace("W", "ln_w[c]" if core.weight else "1.0f").replace("B", "ln_b[c]" if core.bias else "0.0f")
    return passes, red, elem, post


def _row_kernel_fused(fmt: str, core: RowOp, ps: _Scope, es: _Scope) -> str:
    passes, red, elem, post = _row_final(core)
    pcall = ", ".join(["i"] + ps.c_call())
    ecall_tail = ", ".join(es.c_call())
    args = ps.c_args() + es.c_args() + _affine_args(core) + [
        "float* __restrict__ out", "long long outer", "long long cols", "long long inner"]
    lines: list[str] = []
    if fmt == "cpu":
        # Each thread materialises one row's prologue values in a buffer (computed once, vectorised), then
        # runs the passes over the buffer with SIMD reductions, then writes the row.
        lines += ["#pragma omp parallel", "{",
                  "    float* row = (float*)malloc(sizeof(float) * (size_t)cols);",
                  "#pragma omp for schedule(static)",
                  "    for (long long r = 0; r < outer * inner; ++r) {"]
        pargs = ", " + ", ".join(ps.c_call()) if ps.c_call() else ""
        body = ["long long base = (r / inner) * cols * inner + (r % inner);",
                "if (inner == 1) {  // contiguous row: plain vector loads",
                "#pragma omp simd",
                f"    for (long long c = 0; c < cols; ++c) row[c] = pro(base + c{pargs});",
                "} else {",
                "#pragma omp simd",
                f"    for (long long c = 0; c < cols; ++c) row[c] = pro(base + c * inner{pargs});",
                "}"]
        for var, comb, term, finish in passes:
            red_clause = {"sum": "+", "max": "max", "min": "min"}[comb]
            body.append(f"float {var}_acc = {_INIT[comb]};")
            body.append(f"#pragma omp simd reduction({red_clause}:{var}_acc)")
            body.append("for (long long c = 0; c < cols; ++c) {")
            body.append(f"    float s = row[c];")
            if comb == "sum":
                body.append(f"    {var}_acc += {term};")
            else:
                body.append(f"    float v = {term};")
                body.append(f"    {var}_acc = v {'>' if comb == 'max' else '<'} {var}_acc ? v : {var}_acc;")
            body.append("}")
            body.append(f"float {var} = {var}_acc;" + (f" {var} = {finish};" if finish else ""))
        body += [f"float {v} = {e};" for v, e in post]
        if red is not None:
            body.append(f"out[r] = epi(r, {red}{', ' + ecall_tail if ecall_tail else ''});")
        else:
            for stride in ("1", "inner"):
                body.append("if (inner == 1) {" if stride == "1" else "} else {")
                body.append("#pragma omp simd")
                body.append("    for (long long c = 0; c < cols; ++c) {")
                body.append(f"        long long i = base + c * {stride}; float s = row[c];")
                body.append(f"        out[i] = epi(i, {elem}{', ' + ecall_tail if ecall_tail else ''});")
                body.append("    }")
            body.append("}")
        lines += ["        " + b for b in body] + ["    }", "    free(row);", "}"]
    else:
        body = ["long long r = blockIdx.x;", "long long base = (r / inner) * cols * inner + (r % inner);"]
        for var, comb, term, finish in passes:
            body.append(f"float {var}_acc = {_INIT[comb]};")
            body.append("for (long long c = threadIdx.x; c < cols; c += blockDim.x) {")
            body.append(f"    long long i = base + c * inner; float s = pro({pcall});")
            body.append(f"    {var}_acc = combine({var}_acc, {term}, {_COMBINE_CODE[comb]});")
            body.append("}")
            body.append(f"float {var} = block_reduce({var}_acc, {_COMBINE_CODE[comb]});"
                        + (f" {var} = {finish};" if finish else ""))
        body += [f"float {v} = {e};" for v, e in post]
        if red is not None:
            body.append(f"if (threadIdx.x == 0) out[r] = epi(r, {red}{', ' + ecall_tail if ecall_tail else ''});")
        else:
            body.append("for (long long c = threadIdx.x; c < cols; c += blockDim.x) {")
            body.append(f"    long long i = base + c * inner; float s = pro({pcall});")
            body.append(f"    out[i] = epi(i, {elem}{', ' + ecall_tail if ecall_tail else ''});")
            body.append("}")
        lines += body
    return _kernel_decl(fmt, "row_fused", args) + " {\n" + textwrap.indent("\n".join(lines), "    ") + "\n}\n"


def _scan_kernel_fused(fmt: str, core: Scan, ps: _Scope, es: _Scope) -> str:
    comb, ident = _SCAN_OPS[core.kind]
    pcall = ", ".join(["i"] + ps.c_call())
    etail = ", ".join(es.c_call())
    etail = ", " + etail if etail else ""
    args = ps.c_args() + es.c_args() + ["float* __restrict__ out", "long long rows", "long long cols"]
    if fmt == "cpu":
        body = f"""#pragma omp parallel
{{
    float* buf = (float*)malloc(sizeof(float) * (size_t)cols);
#pragma omp for schedule(static)
    for (long long r = 0; r < rows; ++r) {{
#pragma omp simd
        for (long long c = 0; c < cols; ++c) buf[c] = pro(r * cols + c{', ' + ', '.join(ps.c_call()) if ps.c_call() else ''});
        float acc = {ident};
        for (long long c = 0; c < cols; ++c) {{ float s = buf[c]; acc = {comb.format(a="acc", b="s")}; buf[c] = acc; }}
#pragma omp simd
        for (long long c = 0; c < cols; ++c) out[r * cols + c] = epi(r * cols + c, buf[c]{etail});
    }}
    free(buf);
}}"""
    else:
        # Two-level scan: each thread scans a contiguous chunk, a block-wide scan of the chunk totals gives
        # each chunk its starting value, then each thread rescans its chunk from there.
        body = f"""__shared__ float totals[NTHREADS];
long long r = blockIdx.x;
long long chunk = (cols + blockDim.x - 1) / blockDim.x;
long long c0 = threadIdx.x * chunk, c1 = c0 + chunk < cols ? c0 + chunk : cols;
float acc = {ident};
for (long long c = c0; c < c1; ++c) {{ long long i = r * cols + c; float s = pro({pcall}); acc = {comb.format(a="acc", b="s")}; }}
totals[threadIdx.x] = acc;
__syncthreads();
if (threadIdx.x == 0) {{
    float run = {ident};
    for (int t = 0; t < blockDim.x; ++t) {{ float v = totals[t]; totals[t] = run; run = {comb.format(a="run", b="v")}; }}
}}
__syncthreads();
acc = totals[threadIdx.x];
for (long long c = c0; c < c1; ++c) {{
    long long i = r * cols + c;
    float s = pro({pcall});
    acc = {comb.format(a="acc", b="s")};
    out[i] = epi(i, acc{etail});
}}"""
    return _kernel_decl(fmt, "scan_fused", args) + " {\n" + textwrap.indent(body, "    ") + "\n}\n"


def _gemm_geometry_py(core: Gemm, a: str) -> list[str]:
    """Python lines setting batch, m, n, k, b_tensor, strides and the output tensor `out`."""
    lines = []
    if core.batched:
        lines.append(f"batch, m, k = {a}.shape")
    else:
        lines += [f"k = {a}.shape[-1]", f"m = {a}.numel() // k", "batch = 1"]
    if core.b == "":  # Gram: B = A^T
        lines += ["b_t = " + a, "n = m", "b_sk, b_sn = 1, k", "b_sb = m * k"]
    elif core.b_layout == "nk":
        lines += [f"b_t = {core.b}", "n = b_t.shape[0]", "b_sk, b_sn = 1, k", "b_sb = 0"]
    else:
        lines += [f"b_t = {core.b}.contiguous()", "n = b_t.shape[-1]", "b_sk, b_sn = n, 1",
                  "b_sb = k * n if b_t.dim() == 3 else 0"]
    if core.batched:
        lines.append(f"out = torch.empty((batch, m, n), dtype={a}.dtype, device={a}.device)")
    else:
        lines.append(f"out = torch.empty(list({a}.shape[:-1]) + [n], dtype={a}.dtype, device={a}.device)")
    lines.append(f"bias = {core.bias or 'None'}")
    return lines


def _gemm_fused(prog: Program, core: Gemm, fmt: str, src: list[str]) -> list[str]:
    cu = fmt == "cubin"
    py: list[str] = []
    a = core.a
    if prog.prologue:
        fn, ps = _value_fn(fmt, "pro", prog, prog.prologue, core.a, "prologue", None)
        src.append(fn)
        ref = _shape_ref(prog)
        loop = ("for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; "
                "i += (long long)gridDim.x * blockDim.x)" if cu else
                "#pragma omp parallel for simd schedule(static)\n    for (long long i = 0; i < n; ++i)")
        src.append(_kernel_decl(fmt, "prologue_fused", ps.c_args() + ["float* __restrict__ out", "long long n"])
                   + " {\n    " + loop + "\n        out[i] = pro(i, " + ", ".join(ps.c_call()) + ");\n}\n")
        py += [f"a_t = torch.empty_like({ref})", "n_a = a_t.numel()",
               _launch(fmt, "prologue_fused", ps.py_args(ref) + ["a_t", "n_a"], "min((n_a + 255) // 256, 65535)")]
        a = "a_t"
    efn, es = _value_fn(fmt, "epi", prog, prog.epilogue, prog.result, "epilogue", core.target)
    src.append(efn)
    etail = ", ".join(es.c_call())
    etail = ", " + etail if etail else ""
    args = ["const float* __restrict__ A", "const float* __restrict__ Bm", "const float* __restrict__ bias",
            "float* __restrict__ C", "long long batch", "long long M", "long long N", "long long K",
            "long long b_sb", "long long b_sk", "long long b_sn", "int has_bias"] + es.c_args()
    if not cu:
        body = f"""#pragma omp parallel for schedule(static)
for (long long row = 0; row < batch * M; ++row) {{
    long long b = row / M;
    const float* a = A + row * K;
    const float* B = Bm + b * b_sb;
    float* c = C + row * N;
    if (b_sn == 1) {{  // B stored [K, N]: accumulate rows of B (i-k-j order, unit stride inner loop)
        for (long long j = 0; j < N; ++j) c[j] = 0.0f;
        for (long long kk = 0; kk < K; ++kk) {{
            float av = a[kk];
            const float* brow = B + kk * b_sk;
#pragma omp simd
            for (long long j = 0; j < N; ++j) c[j] += av * brow[j];
        }}
    }} else {{  // B stored [N, K]: dot products of contiguous rows
        for (long long j = 0; j < N; ++j) {{
            const float* bcol = B + j * b_sn;
            float s = 0.0f;
#pragma omp simd reduction(+:s)
            for (long long kk = 0; kk < K; ++kk) s += a[kk] * bcol[kk];
            c[j] = s;
        }}
    }}
    for (long long j = 0; j < N; ++j) {{
        long long i = row * N + j;
        c[j] = epi(i, c[j] + (has_bias ? bias[j] : 0.0f){etail});
    }}
}}"""
    else:
        body = f"""__shared__ float As[16][17];
__shared__ float Bs[16][17];
long long b = blockIdx.z;
long long row = blockIdx.y * 16 + threadIdx.y, col = blockIdx.x * 16 + threadIdx.x;
const float* a = A + b * M * K;
const float* B = Bm + b * b_sb;
float acc = 0.0f;
for (long long k0 = 0; k0 < K; k0 += 16) {{
    long long ka = k0 + threadIdx.x, kb = k0 + threadIdx.y;
    As[threadIdx.y][threadIdx.x] = (row < M && ka < K) ? a[row * K + ka] : 0.0f;
    Bs[threadIdx.y][threadIdx.x] = (kb < K && col < N) ? B[kb * b_sk + col * b_sn] : 0.0f;
    __syncthreads();
    for (int t = 0; t < 16; ++t) acc += As[threadIdx.y][t] * Bs[t][threadIdx.x];
    __syncthreads();
}}
if (row < M && col < N) {{
    long long i = (b * M + row) * N + col;
    C[i] = epi(i, acc + (has_bias ? bias[col] : 0.0f){etail});
}}"""
    src.append(_kernel_decl(fmt, "gemm_fused", args) + " {\n" + textwrap.indent(body, "    ") + "\n}\n")
    py += _gemm_geometry_py(core, a)
    call_args = [a, "b_t", "bias", "out", "batch", "m", "n", "k", "b_sb", "b_sk", "b_sn",
                 "0 if bias is None else 1"] + es.py_args("out")
    if cu:
        py.append(f"K.gemm_fused({', '.join(call_args)}, grid=((n + 15) // 16, (m + 15) // 16, batch), block=(16, 16))")
    else:
        py.append(f"K.gemm_fused({', '.join(call_args)})")
    py.append("return out")
    return py


# ------------------------------------------------------------------------------------------------ naive variant


def _naive(prog: Program, fmt: str) -> dict[str, str]:
    cu = fmt == "cubin"
    src: list[str] = [_prelude(fmt)]
    py: list[str] = []
    env: dict[str, str] = {n: n for n in prog.inputs}  # python name -> tensor variable
    ref = _shape_ref(prog)
    counter = [0]

    def step_kernels(steps: list[Step], phase: str, ref_var: str) -> None:
        for st in steps:
            k = counter[0]
            counter[0] += 1
            arrays = [u for u in st.uses if u not in prog.params and u not in prog.floats]
            params = [u for u in st.uses if u in prog.params]
            floats = [u for u in st.uses if u in prog.floats]
            cargs = [f"const float* __restrict__ a_{u}" for u in arrays]
            for p in params:
                cargs += [f"const float* __restrict__ {p}", f"long long {p}_count", f"long long {p}_inner"]
            cargs += [f"float {f}" for f in floats] + ["float* __restrict__ out", "long long n"]
            binding = {u: f"a_{u}[i]" for u in arrays}
            binding.update({p: f"{p}[(i / {p}_inner) % {p}_count]" for p in params})
            binding.update({f: f for f in floats})
            expr = st.expr.format_map(binding)
            loop = ("long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;\n    if (i < n) out[i] = "
                    + expr + ";" if cu else "for (long long i = 0; i < n; ++i) out[i] = " + expr + ";")
            src.append(_kernel_decl(fmt, f"step{k}", cargs) + " {\n    " + loop + "\n}\n")
            out_var = f"t{k}"
            pyargs = [env[u] for u in arrays]
            for p in params:
                par = prog.params[p]
                pyargs += [par.expr, _bcast_call(par.expr, ref_var, par.axis)]
            pyargs += [prog.floats[f] for f in floats]
            py.append(f"{out_var} = torch.empty_like({ref_var})")
            py.append(_launch(fmt, f"step{k}", pyargs + [out_var, f"{out_var}.numel()"],
                              f"({out_var}.numel() + 255) // 256"))
            env[st.target] = out_var

    step_kernels(prog.prologue, "prologue", ref)
    core = prog.core
    if isinstance(core, RowOp):
        passes, red, elem, post = _row_final(core)
        cargs = ["const float* __restrict__ s_in"] + _affine_args(core) + [
            "float* __restrict__ out", "long long outer", "long long cols", "long long inner"]
        body = ["long long base = (r / inner) * cols * inner + (r % inner);"]
        for var, comb, term, finish in passes:
            # sums accumulate in double (as in the compact variant): a float running sum over a row of millions
            # of elements drifts past the sandbox's precision budget (seen on the H200 on gpu_tr_061)
            body.append(f"double {var}_acc = 0.0;" if comb == "sum" else f"float {var}_acc = {_INIT[comb]};")
            body.append("for (long long c = 0; c < cols; ++c) {")
            body.append("    float s = s_in[base + c * inner];")
            body.append(f"    {var}_acc = " + (f"{var}_acc + {term};" if comb == "sum" else f"f{comb}f({var}_acc, {term});"))
            body.append("}")
            body.append(f"float {var} = {var}_acc;" + (f" {var} = {finish};" if finish else ""))
        body += [f"float {v} = {e};" for v, e in post]
        if red is not None:
            body.append(f"out[r] = {red};")
        else:
            body.append("for (long long c = 0; c < cols; ++c) {")
            body.append(f"    float s = s_in[base + c * inner]; out[base + c * inner] = {elem};")
            body.append("}")
        head = ("long long r = blockIdx.x * (long long)blockDim.x + threadIdx.x;\nif (r >= outer * inner) return;\n"
                if cu else "for (long long r = 0; r < outer * inner; ++r) {\n")
        text = head + "\n".join(body) + ("" if cu else "\n}")
        src.append(_kernel_decl(fmt, "row_naive", cargs) + " {\n" + textwrap.indent(text, "    ") + "\n}\n")
        reduces = red is not None
        s = env[core.source]
        py += [f"outer, cols, inner, out_shape = row_geometry({s}.shape, {_row_dim(core)}, {core.keepdim}, {reduces})",
               f"r_out = torch.empty(out_shape, dtype={s}.dtype, device={s}.device)",
               _launch(fmt, "row_naive", [s] + [a for a in (core.weight, core.bias) if a]
                       + ["r_out", "outer", "cols", "inner"], "(outer * inner + 127) // 128", "128")]
        env[core.target] = "r_out"
    elif isinstance(core, Scan):
        comb, ident = _SCAN_OPS[core.kind]
        cargs = ["const float* __restrict__ s_in", "float* __restrict__ out", "long long rows", "long long cols"]
        acc_decl = {"cumsum": "double acc = 0.0", "cumprod": "double acc = 1.0"}.get(core.kind, f"float acc = {ident}")
        inner = (f"{acc_decl};\nfor (long long c = 0; c < cols; ++c) {{ acc = "
                 f"{comb.format(a='acc', b='s_in[r * cols + c]')}; out[r * cols + c] = acc; }}")
        text = (("long long r = blockIdx.x * (long long)blockDim.x + threadIdx.x;\nif (r >= rows) return;\n" + inner)
                if cu else "for (long long r = 0; r < rows; ++r) {\n" + textwrap.indent(inner, "    ") + "\n}")
        src.append(_kernel_decl(fmt, "scan_naive", cargs) + " {\n" + textwrap.indent(text, "    ") + "\n}\n")
        s = env[core.source]
        py += ["r_out = torch.empty_like(" + s + ")", f"cols = {s}.shape[-1]", "rows = r_out.numel() // cols",
               _launch(fmt, "scan_naive", [s, "r_out", "rows", "cols"], "(rows + 127) // 128", "128")]
        env[core.target] = "r_out"
    elif isinstance(core, Gemm):
        cargs = ["const float* __restrict__ A", "const float* __restrict__ Bm", "const float* __restrict__ bias",
                 "float* __restrict__ C", "long long batch", "long long M", "long long N", "long long K",
                 "long long b_sb", "long long b_sk", "long long b_sn", "int has_bias"]
        inner = ("float s = has_bias ? bias[j] : 0.0f;\n"
                 "for (long long kk = 0; kk < K; ++kk) s += A[(b * M + i) * K + kk] * Bm[b * b_sb + kk * b_sk + j * b_sn];\n"
                 "C[(b * M + i) * N + j] = s;")
        if cu:
            text = ("long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x;\nif (t >= batch * M * N) return;\n"
                    "long long b = t / (M * N), i = (t / N) % M, j = t % N;\n" + inner)
        else:
            text = ("for (long long b = 0; b < batch; ++b)\n    for (long long i = 0; i < M; ++i)\n"
                    "        for (long long j = 0; j < N; ++j) {\n" + textwrap.indent(inner, "            ") + "\n        }")
        src.append(_kernel_decl(fmt, "gemm_naive", cargs) + " {\n" + textwrap.indent(text, "    ") + "\n}\n")
        a = env[core.a]
        py += _gemm_geometry_py(core, a)
        py.append(_launch(fmt, "gemm_naive", [a, "b_t", "bias", "out", "batch", "m", "n", "k", "b_sb", "b_sk",
                                              "b_sn", "0 if bias is None else 1"], "(batch * m * n + 255) // 256"))
        py.append("r_out = out")
        env[core.target] = "r_out"
    if core is not None:
        step_kernels(prog.epilogue, "epilogue", env[core.target])
    py.append(f"return {env[prog.result]}")
    return {"model_new.py": _py_model(prog, py), f"kernels/naive.{'cu' if cu else 'cpp'}": "\n".join(src)}


def render(prog: Program, fmt: str, variant: str) -> dict[str, str]:
    """Solution files for the program. Raises ValueError for an unknown format or variant."""
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {fmt!r}")
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    return _fused(prog, fmt) if variant == "fused" else _naive(prog, fmt)
