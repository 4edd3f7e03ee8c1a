"""The "compact" variant of fused-family demonstrations: short solutions that mirror the reference line by line.

For small models trained from scratch, every token of a demonstration costs, and a solution that follows the
reference's statements in order is a translation a small model can learn. So the compact variant

  - includes the sandbox's helper header (`#include "cuda_agent.h"`, sandbox/include: scalar activations, the
    `AT(p, i)` broadcast read, vectorisable math on the CPU) instead of carrying its own prelude, and imports the
    shape helpers `bcast` and `row_geometry` from `sandbox.runtime` (sandbox/FORMATS.md);
  - writes at most three kernels: `prologue` (the pointwise statements before the core op, or all of them),
    the core op (`row_op`, `scan_op` or `matmul`) and `epilogue` (the pointwise statements after it). A pointwise
    kernel keeps the reference's variable names and statement order, each C statement under the reference's
    statement as a comment: `// x = F.silu(x)` then `x = silu_f(x);` (the core kernels and their launch in
    model_new.py carry theirs too). Copying a line, then translating the line just above, is what a small model
    learns fastest: the constants and the order come from the comment, not from far back in the prompt.

cpu: OpenMP over elements / rows; cubin: one thread per element / row / output. Correct, usually not faster than
eager for row ops (one thread per row), often faster for pointwise chains (one pass instead of one per
statement). `render_compact(program, fmt)` returns the files: `model_new.py` and `kernels/kernel.cpp` (cpu) or
`kernels/kernel.cu` (cubin).
"""

from __future__ import annotations

from tasks.demos.codegen import _INIT, _ROW_PASSES, _SCAN_OPS, _bcast_call, _row_dim, _shape_ref
from tasks.demos.ir import REDUCTIONS, Gemm, Program, RowOp, Scan, Step, lit

_C_RESERVED = {"i", "n", "out", "r", "c", "s", "float", "int", "long", "double", "char", "if", "else", "for",
               "return", "auto", "const", "static", "inline", "void", "unsigned", "signed", "short", "struct",
               "union", "switch", "case", "default", "while", "do", "break", "continue", "goto", "register",
               "sizeof", "typedef", "volatile", "extern", "enum", "new", "delete", "this", "class", "template"}

_PY_HEAD = """import torch
import torch.nn as nn

from sandbox.runtime import bcast, load_kernels, row_geometry

K = load_kernels()
"""


def _cname(name: str) -> str:
    return name + "_" if name in _C_RESERVED else name


def _kernel(fmt: str, name: str, args: list[str], body: list[str], index: str, count: str, comment: str = "") -> str:
    """An entry point whose body runs once per `index` in [0, count): an OpenMP loop (cpu) or one thread each.
    comment: the reference statement it computes, as a first line `// ...`."""
    head = f'extern "C" {"__global__ " if fmt == "cubin" else ""}void {name}({", ".join(args)}) {{'
    if comment:
        head += f"\n    // {comment}"
    if fmt == "cubin":
        lines = [head, f"    long long {index} = blockIdx.x * (long long)blockDim.x + threadIdx.x;",
                 f"    if ({index} >= {count}) return;"] + ["    " + b for b in body]
    else:
        lines = [head, "#pragma omp parallel for", f"    for (long long {index} = 0; {index} < {count}; ++{index}) {{"]
        lines += ["        " + b for b in body] + ["    }"]
    return "\n".join(lines + ["}"]) + "\n"


def _launch(fmt: str, name: str, args: list[str], count: str) -> str:
    call = f"K.{name}({', '.join(args)}"
    if fmt == "cubin":
        call += f", grid=(({count} + 255) // 256,), block=(256,)"
    return call + ")"


def _pointwise(prog: Program, fmt: str, name: str, steps: list[Step], want: str, arrays_first: list[str],
               py_ref: str, py_arrays: dict[str, str], py_out: str) -> tuple[str, list[str]]:
    """(C source, Python lines) of one pointwise kernel computing `want` from the steps, element by element.

    arrays_first: names that hold a tensor when the kernel starts (the core op's result for the epilogue);
    py_arrays: their Python variables; py_ref: the tensor whose shape the kernel runs over; py_out: its output.
    """
    defined: set[str] = set()
    arrays: list[str] = []
    params: list[str] = []
    floats: list[str] = []

    def need(n: str) -> None:
        if n in defined:
            return
        if n in prog.params:
            if n not in params:
                params.append(n)
        elif n in prog.floats:
            if n not in floats:
                floats.append(n)
        elif n not in arrays:
            arrays.append(n)

    for st in steps:
        for u in st.uses:
            need(u)
        defined.add(st.target)
    if want not in defined:
        need(want)
    arrays = [a for a in arrays_first if a in arrays] + [a for a in arrays if a not in arrays_first]
    cargs = [f"const float* in_{_cname(a)}" for a in arrays]
    for p in params:
        cargs += [f"const float* {p}", f"long long {p}_count", f"long long {p}_inner"]
    cargs += [f"float {f}" for f in floats] + ["float* out", "long long n"]
    body = [f"float {_cname(a)} = in_{_cname(a)}[i];" for a in arrays]
    declared = set(arrays)
    for st in steps:
        binding = {u: (f"AT({u}, i)" if u in prog.params else _cname(u)) for u in st.uses}
        expr = st.expr.format_map(binding)
        if expr.startswith("(") and expr.endswith(")") and _balanced(expr[1:-1]):
            expr = expr[1:-1]
        tgt = _cname(st.target)
        if st.line:
            body.append(f"// {st.line}")
        body.append(f"{tgt} = {expr};" if st.target in declared else f"float {tgt} = {expr};")
        declared.add(st.target)
    body.append(f"out[i] = {_cname(want)};")
    src = _kernel(fmt, name, cargs, body, "i", "n")
    pyargs = [py_arrays.get(a, a) for a in arrays]
    for p in params:
        par = prog.params[p]
        pyargs += [par.expr, _bcast_call(par.expr, py_ref, par.axis)]
    pyargs += [prog.floats[f] for f in floats]
    py = [f"{py_out} = torch.empty_like({py_ref})",
          _launch(fmt, name, pyargs + [py_out, f"{py_out}.numel()"], f"{py_out}.numel()")]
    return src, py


def _balanced(s: str) -> bool:
    depth = 0
    for ch in s:
        depth += ch == "("
        depth -= ch == ")"
        if depth < 0:
            return False
    return depth == 0


def _row_op(fmt: str, core: RowOp, src_var: str, out_var: str) -> tuple[str, list[str]]:
    passes, post, red, elem = _ROW_PASSES[core.kind]
    post = [(v, e.replace("EPS", lit(core.eps))) for v, e in post]
    cargs = ["const float* in"]
    affine = []
    if core.weight:
        cargs.append("const float* weight")
        affine.append(core.weight)
    if core.bias:
        cargs.append("const float* bias")
        affine.append(core.bias)
    cargs += ["float* out", "long long outer", "long long cols", "long long inner"]
    body = ["long long base = (r / inner) * cols * inner + r % inner;"]
    for var, comb, term, finish in passes:
        # sums accumulate in double: a float running sum over a long row drifts past the sandbox's precision budget
        body.append(f"double {var} = 0.0;" if comb == "sum" else f"float {var} = {_INIT[comb]};")
        upd = f"{var} += {term};" if comb == "sum" else f"{var} = f{comb}f({var}, {term});"
        body.append(f"for (long long c = 0; c < cols; ++c) {{ float s = in[base + c * inner]; {upd} }}")
        if finish:
            body.append(f"{var} = {finish};")
    body += [f"float {v} = {e};" for v, e in post]
    if red is not None:
        body.append(f"out[r] = {red};")
    else:
        e = elem.replace("W", "weight[c]" if core.weight else "1.0f").replace("B", "bias[c]" if core.bias else "0.0f")
        e = e.replace(" * 1.0f", "").replace(" + 0.0f", "")
        body.append(f"for (long long c = 0; c < cols; ++c) {{ float s = in[base + c * inner]; "
                    f"out[base + c * inner] = {e}; }}")
    src = _kernel(fmt, "row_op", cargs, body, "r", "outer * inner", core.line)
    py = [f"# {core.line}"] * bool(core.line) + [f"outer, cols, inner, shape = row_geometry({src_var}.shape, {_row_dim(core)}, {core.keepdim}, "
          f"{core.kind in REDUCTIONS})",
          f"{out_var} = torch.empty(shape, device={src_var}.device)",
          _launch(fmt, "row_op", [src_var] + affine + [out_var, "outer", "cols", "inner"], "outer * inner")]
    return src, py


def _scan_op(fmt: str, core: Scan, src_var: str, out_var: str) -> tuple[str, list[str]]:
    comb, ident = _SCAN_OPS[core.kind]
    acc = "double acc = " + ("1.0" if core.kind == "cumprod" else "0.0") if core.kind in ("cumsum", "cumprod") \
        else f"float acc = {ident}"  # running sums and products in double, as torch accumulates them
    body = [f"{acc};",
            f"for (long long c = 0; c < cols; ++c) {{ acc = {comb.format(a='acc', b='in[r * cols + c]')}; "
            f"out[r * cols + c] = acc; }}"]
    src = _kernel(fmt, "scan_op", ["const float* in", "float* out", "long long rows", "long long cols"], body, "r",
                  "rows", core.line)
    py = [f"# {core.line}"] * bool(core.line) + [f"{out_var} = torch.empty_like({src_var})", f"cols = {src_var}.shape[-1]",
          _launch(fmt, "scan_op", [src_var, out_var, f"{out_var}.numel() // cols", "cols"], f"{out_var}.numel() // cols")]
    return src, py


def _matmul(fmt: str, core: Gemm, a_var: str, out_var: str) -> tuple[str, list[str]]:
    cargs = ["const float* A", "const float* B", "const float* bias", "float* C", "long long batch", "long long M",
             "long long N", "long long K", "long long b_sb", "long long b_sk", "long long b_sn"]
    if fmt == "cubin":
        body = ["long long row = t / N, j = t % N, b = row / M;"]
        index, count = "t", "batch * M * N"
    else:
        body = ["long long b = row / M;", "for (long long j = 0; j < N; ++j) {"]
        index, count = "row", "batch * M"
    inner = ["float s = bias ? bias[j] : 0.0f;",
             "for (long long k = 0; k < K; ++k) s += A[row * K + k] * B[b * b_sb + k * b_sk + j * b_sn];",
             "C[row * N + j] = s;"]
    body += inner if fmt == "cubin" else ["    " + x for x in inner] + ["}"]
    src = _kernel(fmt, "matmul", cargs, body, index, count, core.line)
    py = [f"# {core.line}"] * bool(core.line)
    if core.batched:
        py.append(f"batch, m, k = {a_var}.shape")
    else:
        py += [f"k = {a_var}.shape[-1]", f"m = {a_var}.numel() // k", "batch = 1"]
    if core.b == "":  # Gram: B = A^T
        py += [f"b_t = {a_var}", "n = m", "b_sb, b_sk, b_sn = m * k, 1, k"]
    elif core.b_layout == "nk":
        py += [f"b_t = {core.b}", "n = b_t.shape[0]", "b_sb, b_sk, b_sn = 0, 1, k"]
    else:
        py += [f"b_t = {core.b}.contiguous()", "n = b_t.shape[-1]", "b_sb, b_sk, b_sn = (k * n if b_t.dim() == 3 else 0), n, 1"]
    shape = "(batch, m, n)" if core.batched else f"list({a_var}.shape[:-1]) + [n]"
    py.append(f"{out_var} = torch.empty({shape}, device={a_var}.device)")
    py.append(_launch(fmt, "matmul", [a_var, "b_t", core.bias or "None", out_var, "batch", "m", "n", "k", "b_sb",
                                      "b_sk", "b_sn"], "batch * m * n"))
    return src, py


def plan(prog: Program) -> str:
    """One line on the solution's kernels (the demonstration's plan)."""
    core = prog.core
    parts = []
    if prog.prologue:
        parts.append("a pointwise kernel" if core is None else "a prologue kernel")
    if isinstance(core, RowOp):
        parts.append(f"a {core.kind} row kernel")
    elif isinstance(core, Scan):
        parts.append(f"a {core.kind} scan kernel")
    elif isinstance(core, Gemm):
        parts.append("a matmul kernel")
    if prog.epilogue:
        parts.append("an epilogue kernel")
    return ", ".join(parts)


def render_compact(prog: Program, fmt: str) -> dict[str, str]:
    """Solution files of the compact variant (see the module doc). Raises ValueError for an unknown format."""
    if fmt not in ("cpu", "cubin"):
        raise ValueError(f"format must be cpu or cubin, got {fmt!r}")
    core = prog.core
    srcs: list[str] = []
    py = [f"{n} = {n}.contiguous()" for n in prog.inputs]
    want = prog.result if core is None else (core.a if isinstance(core, Gemm) else core.source)
    cur = want
    if any(st.target == want for st in prog.prologue):
        out_var = "out" if core is None else "t"
        s, p = _pointwise(prog, fmt, "prologue", prog.prologue, want, [], _shape_ref(prog), {}, out_var)
        srcs.append(s)
        py += p
        cur = out_var
    if core is not None:
        out_var = "r" if prog.epilogue else "out"
        if isinstance(core, RowOp):
            s, p = _row_op(fmt, core, cur, out_var)
        elif isinstance(core, Scan):
            s, p = _scan_op(fmt, core, cur, out_var)
        else:
            s, p = _matmul(fmt, core, cur, out_var)
        srcs.append(s)
        py += p
        if prog.epilogue:
            s, p = _pointwise(prog, fmt, "epilogue", prog.epilogue, prog.result, [core.target], "r",
                              {core.target: "r"}, "out")
            srcs.append(s)
            py += p
    py.append("return out")
    init = prog.init_source
    model = (_PY_HEAD + "\n\nclass ModelNew(nn.Module):\n" + _indent(init, 4) + "\n\n"
             + f"    def forward({', '.join(['self'] + prog.inputs)}):\n" + _indent("\n".join(py), 8) + "\n")
    kernel = '#include "cuda_agent.h"\n\n' + "\n".join(srcs)
    return {"model_new.py": model, f"kernels/kernel.{'cu' if fmt == 'cubin' else 'cpp'}": kernel}


def _indent(text: str, n: int) -> str:
    return "\n".join((" " * n + line) if line else line for line in text.splitlines())
