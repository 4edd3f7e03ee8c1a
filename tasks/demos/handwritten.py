"""Solutions for single-operator tasks outside the fused family: 2D convolution and 2x2 pooling (written
out here), RMSNorm and the MSE loss (the fused-family code generator on a hand-built IR).

Each builder takes the task's reference source (for the constructor, reused verbatim) and returns the files of
one (format, variant). Variants: naive = the textbook loop nest with a bounds check per tap (cubin: one thread
per output plane); fast = valid-range loops whose innermost loop runs over contiguous output columns (it
vectorises; OpenMP over planes), cubin: one thread per output element.
"""

from __future__ import annotations

import ast

from tasks.demos.codegen import render
from tasks.demos.ir import Program, RowOp, Step, Unsupported

_PY_HEAD = '''import torch
import torch.nn as nn

from sandbox.runtime import load_kernels

K = load_kernels()


class ModelNew(nn.Module):
'''


def _init_source(reference: str) -> str:
    tree = ast.parse(reference)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Model")
    init = next(f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "__init__")
    return ast.unparse(init)


def _indent(text: str, n: int) -> str:
    return "\n".join((" " * n + line) if line else line for line in text.splitlines())


def _model_new(reference: str, forward: str) -> str:
    return _PY_HEAD + _indent(_init_source(reference), 4) + "\n\n" + _indent(forward.strip(), 4) + "\n"


# ------------------------------------------------------------------------------------------------ conv2d

_CONV_CPU_NAIVE = r"""
// Direct convolution: for every output, every input channel and every tap, with a bounds check per tap.
extern "C" void conv2d_naive(const float* x, const float* w, const float* b, float* y, long long N, long long C,
                             long long H, long long W, long long O, long long KH, long long KW, long long pad) {
    long long OH = H + 2 * pad - KH + 1, OW = W + 2 * pad - KW + 1;
    for (long long n = 0; n < N; ++n)
        for (long long o = 0; o < O; ++o)
            for (long long oh = 0; oh < OH; ++oh)
                for (long long ow = 0; ow < OW; ++ow) {
                    float s = b ? b[o] : 0.0f;
                    for (long long c = 0; c < C; ++c)
                        for (long long kh = 0; kh < KH; ++kh)
                            for (long long kw = 0; kw < KW; ++kw) {
                                long long ih = oh + kh - pad, iw = ow + kw - pad;
                                if (ih >= 0 && ih < H && iw >= 0 && iw < W)
                                    s += x[((n * C + c) * H + ih) * W + iw] * w[((o * C + c) * KH + kh) * KW + kw];
                            }
                    y[((n * O + o) * OH + oh) * OW + ow] = s;
                }
}
"""

_CONV_CPU_FAST = r"""
// One output plane per (n, o), accumulated tap by tap over the valid range: the innermost loop runs over
// contiguous output columns and vectorises; OpenMP over planes.
extern "C" void conv2d_fast(const float* x, const float* w, const float* b, float* y, long long N, long long C,
                            long long H, long long W, long long O, long long KH, long long KW, long long pad) {
    long long OH = H + 2 * pad - KH + 1, OW = W + 2 * pad - KW + 1;
#pragma omp parallel for collapse(2) schedule(static)
    for (long long n = 0; n < N; ++n)
        for (long long o = 0; o < O; ++o) {
            float* out = y + (n * O + o) * OH * OW;
            float bias = b ? b[o] : 0.0f;
            for (long long i = 0; i < OH * OW; ++i) out[i] = bias;
            for (long long c = 0; c < C; ++c) {
                const float* in = x + (n * C + c) * H * W;
                for (long long kh = 0; kh < KH; ++kh)
                    for (long long kw = 0; kw < KW; ++kw) {
                        float wv = w[((o * C + c) * KH + kh) * KW + kw];
                        long long oh0 = pad - kh > 0 ? pad - kh : 0;
                        long long oh1 = H + pad - kh < OH ? H + pad - kh : OH;
                        long long ow0 = pad - kw > 0 ? pad - kw : 0;
                        long long ow1 = W + pad - kw < OW ? W + pad - kw : OW;
                        for (long long oh = oh0; oh < oh1; ++oh) {
                            const float* irow = in + (oh + kh - pad) * W + (kw - pad);
                            float* orow = out + oh * OW;
                            for (long long ow = ow0; ow < ow1; ++ow) orow[ow] += wv * irow[ow];
                        }
                    }
            }
        }
}
"""

_CONV_CU_NAIVE = r"""
// One thread per output plane (n, o): little parallelism, every tap bounds-checked.
extern "C" __global__ void conv2d_naive(const float* x, const float* w, const float* b, float* y, long long N,
                                        long long C, long long H, long long W, long long O, long long KH,
                                        long long KW, long long pad) {
    long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (t >= N * O) return;
    long long n = t / O, o = t % O;
    long long OH = H + 2 * pad - KH + 1, OW = W + 2 * pad - KW + 1;
    for (long long oh = 0; oh < OH; ++oh)
        for (long long ow = 0; ow < OW; ++ow) {
            float s = b ? b[o] : 0.0f;
            for (long long c = 0; c < C; ++c)
                for (long long kh = 0; kh < KH; ++kh)
                    for (long long kw = 0; kw < KW; ++kw) {
                        long long ih = oh + kh - pad, iw = ow + kw - pad;
                        if (ih >= 0 && ih < H && iw >= 0 && iw < W)
                            s += x[((n * C + c) * H + ih) * W + iw] * w[((o * C + c) * KH + kh) * KW + kw];
                    }
            y[((n * O + o) * OH + oh) * OW + ow] = s;
        }
}
"""

_CONV_CU_FAST = r"""
// One thread per output element; consecutive threads take consecutive output columns (coalesced loads).
extern "C" __global__ void conv2d_fast(const float* __restrict__ x, const float* __restrict__ w,
                                       const float* __restrict__ b, float* __restrict__ y, long long N, long long C,
                                       long long H, long long W, long long O, long long KH, long long KW,
                                       long long pad) {
    long long OH = H + 2 * pad - KH + 1, OW = W + 2 * pad - KW + 1;
    long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (t >= N * O * OH * OW) return;
    long long ow = t % OW, oh = (t / OW) % OH, o = (t / (OW * OH)) % O, n = t / (OW * OH * O);
    float s = b ? b[o] : 0.0f;
    for (long long c = 0; c < C; ++c) {
        const float* in = x + (n * C + c) * H * W;
        const float* wk = w + (o * C + c) * KH * KW;
        for (long long kh = 0; kh < KH; ++kh) {
            long long ih = oh + kh - pad;
            if (ih < 0 || ih >= H) continue;
            for (long long kw = 0; kw < KW; ++kw) {
                long long iw = ow + kw - pad;
                if (iw >= 0 && iw < W) s += in[ih * W + iw] * wk[kh * KW + kw];
            }
        }
    }
    y[t] = s;
}
"""

_CONV_FORWARD = '''
def forward(self, x):
    x = x.contiguous()
    w = self.{attr}.weight
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    pad = self.{attr}.padding[0]
    y = torch.empty((n, o, h + 2 * pad - kh + 1, wd + 2 * pad - kw + 1), dtype=x.dtype, device=x.device)
    K.{kernel}(x, w, self.{attr}.bias, y, n, c, h, wd, o, kh, kw, pad{launch})
    return y
'''


def conv2d(reference: str, fmt: str, variant: str) -> dict[str, str]:
    """nn.Conv2d with stride 1, square padding, dilation 1, groups 1 (the `op_conv2d` task)."""
    attr = _conv_attr(reference)
    kernel = f"conv2d_{variant}"
    src = {("cpu", "naive"): _CONV_CPU_NAIVE, ("cpu", "fast"): _CONV_CPU_FAST,
           ("cubin", "naive"): _CONV_CU_NAIVE, ("cubin", "fast"): _CONV_CU_FAST}[(fmt, variant)]
    if fmt == "cubin":
        total = "n * o" if variant == "naive" else "y.numel()"
        launch = f", grid=(({total} + 127) // 128,), block=(128,)"
    else:
        launch = ""
    fwd = _CONV_FORWARD.format(attr=attr, kernel=kernel, launch=launch)
    ext = "cu" if fmt == "cubin" else "cpp"
    return {"model_new.py": _model_new(reference, fwd), f"kernels/conv2d.{ext}": src.lstrip()}


def _conv_attr(reference: str) -> str:
    tree = ast.parse(reference)
    for node in ast.walk(tree):
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
                and isinstance(node.value.func, ast.Attribute) and node.value.func.attr == "Conv2d"):
            kws = {k.arg for k in node.value.keywords}
            if kws - {"kernel_size", "padding", "bias"}:
                raise Unsupported("Conv2d with stride, dilation or groups")
            return node.targets[0].attr  # type: ignore[union-attr]
    raise Unsupported("no nn.Conv2d")


# ------------------------------------------------------------------------------------------------ pooling

def _pool_src(fmt: str, variant: str, op: str) -> str:
    init = "-INFINITY" if op == "max" else "0.0f"
    acc = "s = fmaxf(s, v);" if op == "max" else "s += v;"
    fin = "s" if op == "max" else "s * 0.25f"
    if fmt == "cpu" and variant == "naive":
        return f"""#include <math.h>
// Generic window loop with a bounds check per tap, one thread.
extern "C" void pool_naive(const float* x, float* y, long long planes, long long H, long long W) {{
    long long OH = H / 2, OW = W / 2;
    for (long long p = 0; p < planes; ++p)
        for (long long oh = 0; oh < OH; ++oh)
            for (long long ow = 0; ow < OW; ++ow) {{
                float s = {init};
                for (long long kh = 0; kh < 2; ++kh)
                    for (long long kw = 0; kw < 2; ++kw) {{
                        long long ih = oh * 2 + kh, iw = ow * 2 + kw;
                        if (ih < H && iw < W) {{ float v = x[(p * H + ih) * W + iw]; {acc} }}
                    }}
                y[(p * OH + oh) * OW + ow] = {fin};
            }}
}}
"""
    if fmt == "cpu":
        comb = "fmaxf(fmaxf(r0[2 * ow], r0[2 * ow + 1]), fmaxf(r1[2 * ow], r1[2 * ow + 1]))" if op == "max" else \
               "(r0[2 * ow] + r0[2 * ow + 1] + r1[2 * ow] + r1[2 * ow + 1]) * 0.25f"
        return f"""#include <math.h>
// Two input rows at a time, the 2x2 window unrolled; OpenMP over planes.
extern "C" void pool_fast(const float* x, float* y, long long planes, long long H, long long W) {{
    long long OH = H / 2, OW = W / 2;
#pragma omp parallel for schedule(static)
    for (long long p = 0; p < planes; ++p)
        for (long long oh = 0; oh < OH; ++oh) {{
            const float* r0 = x + (p * H + 2 * oh) * W;
            const float* r1 = r0 + W;
            float* out = y + (p * OH + oh) * OW;
            for (long long ow = 0; ow < OW; ++ow) out[ow] = {comb};
        }}
}}
"""
    if variant == "naive":
        return f"""// One thread per plane.
extern "C" __global__ void pool_naive(const float* x, float* y, long long planes, long long H, long long W) {{
    long long p = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (p >= planes) return;
    long long OH = H / 2, OW = W / 2;
    for (long long oh = 0; oh < OH; ++oh)
        for (long long ow = 0; ow < OW; ++ow) {{
            float s = {init};
            for (long long kh = 0; kh < 2; ++kh)
                for (long long kw = 0; kw < 2; ++kw) {{ float v = x[(p * H + oh * 2 + kh) * W + ow * 2 + kw]; {acc} }}
            y[(p * OH + oh) * OW + ow] = {fin};
        }}
}}
"""
    return f"""// One thread per output element.
extern "C" __global__ void pool_fast(const float* __restrict__ x, float* __restrict__ y, long long planes,
                                     long long H, long long W) {{
    long long OH = H / 2, OW = W / 2;
    long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (t >= planes * OH * OW) return;
    long long ow = t % OW, oh = (t / OW) % OH, p = t / (OW * OH);
    const float* r0 = x + (p * H + 2 * oh) * W + 2 * ow;
    float s = {init}, v;
    v = r0[0]; {acc} v = r0[1]; {acc} v = r0[W]; {acc} v = r0[W + 1]; {acc}
    y[t] = {fin};
}}
"""


def pool2d(reference: str, fmt: str, variant: str) -> dict[str, str]:
    """F.max_pool2d / F.avg_pool2d with a 2x2 window and stride 2 (the `op_maxpool2d` / `op_avgpool2d` tasks)."""
    if "max_pool2d" in reference:
        op = "max"
    elif "avg_pool2d" in reference:
        op = "avg"
    else:
        raise Unsupported("no 2x2 pooling")
    kernel = f"pool_{variant}"
    if fmt == "cubin":
        total = "n * c" if variant == "naive" else "y.numel()"
        launch = f", grid=(({total} + 127) // 128,), block=(128,)"
    else:
        launch = ""
    fwd = f'''
def forward(self, x):
    x = x.contiguous()
    n, c, h, w = x.shape
    y = torch.empty((n, c, h // 2, w // 2), dtype=x.dtype, device=x.device)
    K.{kernel}(x, y, n * c, h, w{launch})
    return y
'''
    ext = "cu" if fmt == "cubin" else "cpp"
    return {"model_new.py": _model_new(reference, fwd), f"kernels/pool.{ext}": _pool_src(fmt, variant, op)}


# ------------------------------------------------------------------------------------------------ via the IR

def rms_norm(reference: str, fmt: str, variant: str) -> dict[str, str]:
    """x / sqrt(mean(x^2, -1) + eps) * weight with `self.eps` and `self.weight` (the `op_rmsnorm` task)."""
    eps = None
    for node in ast.walk(ast.parse(reference)):
        if (isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Attribute)
                and node.targets[0].attr == "eps" and isinstance(node.value, ast.Constant)):
            eps = float(node.value.value)
    if eps is None:
        raise Unsupported("no self.eps constant")
    prog = Program(inputs=["x"], init_source=_init_source(reference),
                   core=RowOp("rms_norm", "x", "y", ("last",), eps=eps, weight="self.weight"), result="y")
    return render(prog, fmt, "fused" if variant == "fast" else "naive")


def mse_loss(reference: str, fmt: str, variant: str) -> dict[str, str]:
    """mean((pred - target)^2) over all elements, a 0-dim result (the `op_mseloss` task)."""
    prog = Program(inputs=["pred", "target"], init_source=_init_source(reference),
                   prologue=[Step("d", "(({pred} - {target}) * ({pred} - {target}))", ["pred", "target"])],
                   core=RowOp("mean", "d", "loss", ("from", 0)), result="loss")
    return render(prog, fmt, "fused" if variant == "fast" else "naive")
