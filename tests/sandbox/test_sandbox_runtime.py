"""The launcher a solution imports: argument checks against the C signature, cpu launches via ctypes."""

import pytest
import torch

from sandbox.config import SandboxConfig
from sandbox.build import build
from sandbox.runtime import LaunchArgumentError, launch_counts, load_kernels
from sandbox.workspace import Workspace

SRC = r'''
extern "C" void axpy(const float* x, float* y, float a, long long n) {
    for (long long i = 0; i < n; ++i) y[i] += a * x[i];
}
extern "C" void fill_i32(int* out, int value, unsigned char count) {
    for (int i = 0; i < count; ++i) out[i] = value;
}
extern "C" void anything(void* p, bool flag) { if (flag) ((char*)p)[0] = 1; }
'''


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("rt")
    cfg = SandboxConfig(cache_dir=str(tmp / "cache"))
    ws = Workspace.create(tmp / "ws", "", {"model_new.py": "", "kernels/k.cpp": SRC}, "cpu")
    res = build(ws, "cpu", cfg, None)
    assert res.ok, res.log
    return load_kernels(res.manifest_path)


def test_launch_with_right_types(kernels):
    x = torch.arange(5, dtype=torch.float32)
    y = torch.ones(5)
    before = launch_counts.get("axpy", 0)
    kernels.axpy(x, y, 2.0, 5)
    assert torch.equal(y, 1 + 2 * x)
    assert launch_counts["axpy"] == before + 1
    out = torch.zeros(4, dtype=torch.int32)
    kernels.fill_i32(out, -7, 4)
    assert out.tolist() == [-7] * 4
    b = torch.zeros(2, dtype=torch.float64)
    kernels.anything(b, True)  # void* takes any dtype
    assert sorted(kernels.names) == ["anything", "axpy", "fill_i32"]


@pytest.mark.parametrize("args,match", [
    ((torch.zeros(5, dtype=torch.float64), torch.zeros(5), 1.0, 5), "dtype"),
    ((torch.zeros(5), torch.zeros(10)[::2], 1.0, 5), "contiguous"),
    ((torch.zeros(5), torch.zeros(5), 1.0), "takes 4 arguments"),
    ((torch.zeros(5), torch.zeros(5), "a", 5), "expects a number"),
    ((torch.zeros(5), torch.zeros(5), 1.0, 2**70), "does not fit"),
    ((torch.zeros(5), torch.zeros(5), 1.0, torch.tensor(5)), "not a tensor"),
    (([0.0] * 5, torch.zeros(5), 1.0, 5), "expects a torch tensor"),
])
def test_bad_arguments_are_named(kernels, args, match):
    with pytest.raises(LaunchArgumentError, match=match):
        kernels.axpy(*args)


def test_unsigned_range_grid_kwargs_and_unknown_kernel(kernels):
    with pytest.raises(LaunchArgumentError, match="does not fit"):
        kernels.fill_i32(torch.zeros(4, dtype=torch.int32), 1, 300)
    with pytest.raises(LaunchArgumentError, match="grid/block are for cubin"):
        kernels.axpy(torch.zeros(1), torch.zeros(1), 1.0, 1, grid=(1,))
    with pytest.raises(AttributeError, match="no kernel named"):
        kernels.nope


class _Sub(torch.Tensor):
    """A tensor subclass: the launcher's checks for it run the full path (_pointer), not the packer's fast case."""


def test_packer_fast_and_checked_paths_agree(kernels):
    from sandbox.runtime import _convert

    k = kernels._kernels["axpy"]
    x, y = torch.arange(5, dtype=torch.float32), torch.zeros(5)
    fast = k._pack.pack((x, y, 2, 5))
    ref = [v.value for v in _convert(k.signature, (x, y, 2, 5), "cpu")]
    assert fast == ref and type(fast[2]) is float  # an int for a float parameter is converted, as before
    w = torch.nn.Parameter(torch.arange(5, dtype=torch.float32), requires_grad=False)
    kernels.axpy(w, y, 1.0, 5)  # nn.Parameter: the fast case
    kernels.axpy(x.as_subclass(_Sub), y, 1.0, 5)  # a subclass: the checked path, same launch
    assert torch.equal(y, 2 * x)
    with pytest.raises(LaunchArgumentError, match="expects a number, got bool"):
        kernels.axpy(x, y, True, 5)
    with pytest.raises(LaunchArgumentError, match="expects an int, got float"):
        kernels.axpy(x, y, 1.0, 5.0)
    with pytest.raises(LaunchArgumentError, match="dtype is torch.float64"):
        kernels.axpy(x.double().as_subclass(_Sub), y, 1.0, 5)


def test_a_launch_imports_nothing(kernels, monkeypatch):
    """Every import statement in a launch is a round through the candidate's import hook (and its audit events):
    the launcher binds what it needs at load."""
    import builtins

    seen = []
    real = builtins.__import__

    def counting(name, *a, **k):
        seen.append(name)
        return real(name, *a, **k)

    x, y = torch.ones(3), torch.zeros(3)
    monkeypatch.setattr(builtins, "__import__", counting)
    kernels.axpy(x, y, 1.0, 3)
    kernels.fill_i32(torch.zeros(2, dtype=torch.int32), 3, 2)
    monkeypatch.undo()
    assert seen == [] and torch.equal(y, x)
