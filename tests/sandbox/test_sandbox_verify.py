import math

import torch

from sandbox.verify import compare


def test_match_within_tolerance_and_error_figures():
    r = torch.tensor([1.0, 2.0, 3.0])
    tr = compare(r, r + 0.005, 1e-2, 1e-2, 0)
    assert tr.ok and tr.numel == 3 and 0.004 < tr.max_abs_err < 0.006


def test_value_mismatch_counts_elements():
    r = torch.zeros(10)
    c = r.clone()
    c[3] = 1.0
    tr = compare(r, c, 1e-2, 1e-2, 2)
    assert not tr.ok and tr.mismatched == 1 and tr.index == 2 and "outside" in tr.message


def test_nan_where_reference_finite_fails_but_matching_specials_pass():
    r = torch.tensor([1.0, float("nan"), float("inf")])
    ok = compare(r, r.clone(), 1e-2, 1e-2, 0)
    assert ok.ok
    c = r.clone()
    c[0] = float("nan")
    bad = compare(r, c, 1e-2, 1e-2, 0)
    assert not bad.ok and "NaN/Inf" in bad.message and math.isinf(bad.max_abs_err)
    c2 = r.clone()
    c2[2] = 5.0
    assert not compare(r, c2, 1e-2, 1e-2, 0).ok


def test_structure_shape_and_dtype_must_match():
    r = (torch.zeros(2), torch.ones(3))
    assert compare(r, [torch.zeros(2), torch.ones(3)], 1e-2, 1e-2, 0).ok  # tuple and list are interchangeable
    assert "structure" in compare(r, torch.zeros(2), 1e-2, 1e-2, 0).message
    assert "structure" in compare(r, (torch.zeros(2),), 1e-2, 1e-2, 0).message
    assert "shape" in compare(torch.zeros(2, 3), torch.zeros(3, 2), 1e-2, 1e-2, 0).message
    assert "dtype" in compare(torch.zeros(2), torch.zeros(2, dtype=torch.float64), 1e-2, 1e-2, 0).message
    assert "structure" in compare(torch.zeros(2), None, 1e-2, 1e-2, 0).message


def test_integer_and_bool_outputs():
    r = torch.tensor([1, 2, 3])
    assert compare(r, r.clone(), 0.0, 0.0, 0).ok
    assert not compare(r, torch.tensor([1, 2, 4]), 0.0, 0.0, 0).ok
    b = torch.tensor([True, False])
    assert compare(b, b.clone(), 0.0, 0.0, 0).ok
    assert not compare(b, ~b, 0.0, 0.0, 0).ok
