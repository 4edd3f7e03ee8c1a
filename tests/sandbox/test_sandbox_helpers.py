"""What the sandbox ships for solutions: the helper header `cuda_agent.h` (cpu and cubin builds, confined too) and
the shape helpers `bcast` / `row_geometry` of sandbox.runtime."""

import shutil

import pytest
import torch

from sandbox.build import build, jail_for_build
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
