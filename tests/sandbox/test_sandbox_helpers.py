"""What the sandbox ships for solutions: the helper header `cuda_agent.h` (cpu and cubin builds, confined too) and
the shape helpers `bcast` / `row_geometry` of sandbox.runtime."""

import ctypes
import shutil
import subprocess

import pytest
import torch

from sandbox.build import INCLUDE_DIR, build, jail_for_build
from sandbox.config import SandboxConfig
from sandbox.runtime import bcast, load_kernels, row_geometry
from sandbox.workspace import Workspace

HEADER_CPU = '''#include "cuda_agent.h"
extern "C" void act(const float* in_x, const float* w, long long w_count, long long w_inner, float* out, long long n) {
#pragma omp parallel for
    for (long long i = 0; i < n; ++i) {
        float x = in_x[i];
        x = silu_f(x) + expf(-fabsf(x));
        out[i] = x * AT(w, i);
    }
}
'''
HEADER_CU = '''#include "cuda_agent.h"
extern "C" __global__ void act(const float* in_x, float* out, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = block_reduce(in_x[i], 0);
    out[i] = gelu_tanh_f(in_x[i]) + v;
}
'''


def _ws(tmp_path, files, fmt, owner=-1):
    return Workspace.create(tmp_path / "ws", "ref", {"model_new.py": "", **files}, fmt, owner_uid=owner)


@pytest.mark.parametrize("suffix", [".cpp", ".c"])
def test_cpu_solution_on_the_header_builds_confined_and_computes(tmp_path, suffix):
    cfg = SandboxConfig(cache_dir=str(tmp_path / "cache"))
    src = HEADER_CPU if suffix == ".cpp" else HEADER_CPU.replace('extern "C" ', "")
    ws = _ws(tmp_path, {f"kernels/k{suffix}": src}, "cpu", owner=65534)
    r = build(ws, "cpu", cfg, jail_for_build(ws, cfg))
    assert r.ok, r.log
    k = load_kernels(r.manifest_path)
    x, w = torch.randn(4, 6, 5), torch.randn(6, 1)
    out = torch.empty_like(x)
    k.act(x, w, *bcast(w, x), out, out.numel())
    want = (torch.nn.functional.silu(x) + torch.exp(-x.abs())) * w
    assert torch.allclose(out, want, rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_cubin_solution_on_the_header_builds(tmp_path):
    cfg = SandboxConfig(cache_dir=str(tmp_path / "cache"))
    r = build(_ws(tmp_path, {"kernels/k.cu": HEADER_CU}, "cubin"), "cubin", cfg, None, "sm_90a")
    assert r.ok, r.log


def test_bcast_gives_the_index_of_every_broadcast():
    x = torch.randn(2, 3, 4, 5)
    for p, axis, view in [(torch.randn(5), None, (5,)), (torch.randn(3), 1, (1, 3, 1, 1)),
                          (torch.randn(3, 1, 1), None, (3, 1, 1)), (torch.randn(4, 5), None, (4, 5)),
                          (torch.randn(1, 3, 1, 1), None, (1, 3, 1, 1)), (torch.randn(1), None, (1,))]:
        count, inner = bcast(p, x, axis)
        idx = (torch.arange(x.numel()) // inner) % count
        assert torch.equal(p.reshape(-1)[idx], (torch.zeros_like(x) + p.view(view)).reshape(-1)), (p.shape, axis)
    with pytest.raises(ValueError, match="does not broadcast"):
        bcast(torch.randn(7), x)
    with pytest.raises(ValueError, match="not consecutive"):
        bcast(torch.randn(3, 1, 5), x)
    with pytest.raises(ValueError, match="along axis"):
        bcast(torch.randn(4), x, 1)


def test_row_geometry_rows_and_output_shapes():
    assert row_geometry((2, 3, 4), -1) == (6, 4, 1, [2, 3])
    assert row_geometry((2, 3, 4), 1, keepdim=True) == (2, 3, 4, [2, 1, 4])
    assert row_geometry((2, 3, 4, 5), (2, -1)) == (6, 20, 1, [2, 3])
    assert row_geometry((2, 3, 4, 5), (-3, -1), reduce=False) == (2, 60, 1, [2, 3, 4, 5])
    assert row_geometry((2, 3, 4), (1, 2), keepdim=True) == (2, 12, 1, [2, 1, 1])
    x = torch.randn(2, 3, 4)
    outer, cols, inner, shape = row_geometry(x.shape, 1)
    flat = x.reshape(-1)
    sums = [sum(flat[(r // inner) * cols * inner + r % inner + c * inner] for c in range(cols))
            for r in range(outer * inner)]
    assert torch.allclose(torch.stack(sums).view(shape), x.sum(1))
    with pytest.raises(ValueError, match="out of range"):
        row_geometry((2, 3), 2)
    with pytest.raises(ValueError, match="trailing"):
        row_geometry((2, 3, 4), (0, 1))


def test_vector_math_matches_torch(tmp_path):
    """The header's branch-free cpu math (what the fused cpu demonstrations and compact solutions run), compiled
    with the sandbox's flags, against torch (float64): within 2e-5 relative, no libm call left."""
    fns = ["vm_exp", "vm_log", "vm_log1p", "vm_sqrt", "vm_tanh", "vm_erf", "vm_sin", "vm_cos", "vm_atan"]
    cases = "\n".join(f"        case {i}: y[k] = {f}(x[k]); break;" for i, f in enumerate(fns))
    src = ('#include "cuda_agent.h"\nextern "C" void apply(int w, const float* x, float* y, long long n) {\n'
           "    for (long long k = 0; k < n; ++k) switch (w) {\n" + cases + "\n    }\n}\n")
    (tmp_path / "vm.cpp").write_text(src)
    lib_path = tmp_path / "vm.so"
    subprocess.run(["g++", "-O3", "-march=native", "-fPIC", "-fopenmp", "-shared", f"-I{INCLUDE_DIR}",
                    str(tmp_path / "vm.cpp"), "-o", str(lib_path)], check=True)
    undefined = subprocess.run(["nm", "-D", "--undefined-only", str(lib_path)], capture_output=True, text=True).stdout
    for libm in ("expf", "logf", "log1pf", "sqrtf", "tanhf", "erff", "sinf", "cosf", "atanf"):
        assert f" {libm}@" not in undefined, f"{libm} is called: the fused loops would not vectorise"
    lib = ctypes.CDLL(str(lib_path))
    ref = {0: torch.exp, 1: torch.log, 2: torch.log1p, 3: torch.sqrt, 4: torch.tanh, 5: torch.erf, 6: torch.sin,
           7: torch.cos, 8: torch.atan}
    ranges = {0: (-87.0, 88.0), 1: (1e-30, 1e30), 2: (-0.99, 50.0), 3: (0.0, 1e6), 4: (-20.0, 20.0), 5: (-8.0, 8.0),
              6: (-100.0, 100.0), 7: (-100.0, 100.0), 8: (-1e3, 1e3)}
    for w, f in ref.items():
        lo, hi = ranges[w]
        x = (torch.logspace(-30, 30, 100_001) if w == 1 else torch.linspace(lo, hi, 100_001)).float()
        y = torch.empty_like(x)
        lib.apply(ctypes.c_int(w), ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(y.data_ptr()),
                  ctypes.c_longlong(x.numel()))
        want = f(x.double())
        err = ((y.double() - want).abs() / (want.abs() + 1e-6)).max().item()
        assert err < 2e-5, (fns[w], err)
    specials = torch.tensor([0.0, -1.0, float("inf")])
    y = torch.empty_like(specials)
    lib.apply(ctypes.c_int(1), ctypes.c_void_p(specials.data_ptr()), ctypes.c_void_p(y.data_ptr()), ctypes.c_longlong(3))
    assert y[0] == float("-inf") and y[1].isnan() and y[2] == float("inf")
