import pytest
import torch

from sandbox.guard import ComputeGuard, ForbiddenOpError


def test_allocation_view_and_copy_ops_pass_and_empty_is_poisoned():
    x = torch.randn(4, 6)
    with ComputeGuard(poison=True) as g:
        out = torch.empty_like(x)
        ints = torch.empty(3, dtype=torch.int32)
        z = torch.zeros(3)
        v = x.view(24).reshape(6, 4).t().contiguous()[1:3].clone()
        n = x.shape[0] + x.stride(0)
    assert g.violations == []
    assert torch.isnan(out).all() and (ints == -123456789).all() and (z == 0).all()
    assert v.shape == (2, 6) and n == 10


@pytest.mark.parametrize("op", [
    lambda x: torch.relu(x), lambda x: x + 1, lambda x: x.sum(), lambda x: torch.matmul(x, x.t()),
    lambda x: torch.softmax(x, -1), lambda x: x.double(), lambda x: torch.nn.functional.gelu(x),
])
def test_compute_ops_are_caught_and_named(op):
    x = torch.randn(4, 4)
    with ComputeGuard() as g:
        with pytest.raises(ForbiddenOpError):
            op(x)
    assert len(g.violations) == 1 and "aten::" in g.violations[0]


def test_violation_is_recorded_even_when_the_exception_is_swallowed():
    x = torch.randn(3)
    with ComputeGuard() as g:
        try:
            torch.exp(x)
        except ForbiddenOpError:
            pass
    assert "aten::exp" in g.violations[0]
