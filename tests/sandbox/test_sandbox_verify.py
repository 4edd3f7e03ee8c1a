import math
import time

import pytest
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


def test_chunked_comparison_gives_the_verdict_of_one_pass(monkeypatch):
    """Outputs are compared in chunks of CHUNK_ELEMENTS: errors in several chunks, a NaN in one, a mismatched
    special value in another, and a non-contiguous candidate give the counts and error figures of one pass."""
    import sandbox.verify as verify

    g = torch.Generator().manual_seed(0)
    r = torch.randn(40, 25, generator=g)
    r[7, 3] = float("inf")
    c = (r.t().contiguous() + 1e-6).t()  # same values, transposed strides
    c[0, 1] += 1.0
    c[39, 24] -= 2.5
    c[20, 0] = float("nan")
    c[7, 3] = -float("inf")
    whole = compare(r, c, 1e-2, 1e-2, 0)
    monkeypatch.setattr(verify, "CHUNK_ELEMENTS", 64)
    chunked = compare(r, c, 1e-2, 1e-2, 0)
    assert not whole.ok and whole.mismatched == 4
    assert (chunked.ok, chunked.mismatched, chunked.message) == (whole.ok, whole.mismatched, whole.message)
    assert chunked.max_abs_err == whole.max_abs_err and chunked.max_rel_err == whole.max_rel_err
    assert "max abs error 2.5" in whole.message and "differ where the reference is NaN/Inf" in whole.message


@pytest.mark.gpu
def test_a_cuda_reference_is_compared_on_its_device_against_a_host_candidate():
    """The trusted side compares a CUDA reference on the GPU (the candidate's host copy is moved there chunk by
    chunk): same verdict as on the CPU, for a pass and for a failure."""
    r = torch.randn(3 << 20, device="cuda")
    c = r.cpu() + 1e-6
    ok = compare(r, c, 1e-2, 1e-2, 0)
    c[12345] = float("nan")
    c[-1] += 1.0
    bad, bad_cpu = compare(r, c, 1e-2, 1e-2, 1), compare(r.cpu(), c, 1e-2, 1e-2, 1)
    assert ok.ok and not bad.ok and bad.mismatched == 2
    assert (bad.message, bad.max_rel_err) == (bad_cpu.message, bad_cpu.max_rel_err)


def test_verify_threads_is_validated_and_resolves_to_the_usable_cores():
    import os

    from sandbox.config import SandboxConfig
    from sandbox.reference_worker import _compare_threads

    with pytest.raises(ValueError, match="verify_threads"):
        SandboxConfig(verify_threads=-1)
    assert _compare_threads(SandboxConfig(verify_threads=3), cuda=True) == 3
    assert _compare_threads(SandboxConfig(), cuda=True) == len(os.sched_getaffinity(0))
    assert _compare_threads(SandboxConfig(verify_threads=3, cpu_threads=2), cuda=False) == 2


def test_both_sides_run_with_the_fixed_allocator_regime(tmp_path, monkeypatch):
    """The trusted worker and the candidate's environment carry sandbox.jail.MALLOC_ENV (eager's time otherwise
    depended on whether glibc trimmed the heap after each call: 6 or 23 ms a call for the same baseline), and the
    host's own allocator settings reach neither side."""
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.mmap_threshold=131072")
    monkeypatch.setenv("MALLOC_ARENA_MAX", "2")
    from pathlib import Path

    from sandbox.config import SandboxConfig
    from sandbox.evaluator import Evaluator
    from sandbox.jail import MALLOC_ENV
    from sandbox.reference_worker import _worker_env

    cfg = SandboxConfig(backend="cpu", cache_dir=str(tmp_path / "cache"), work_root=str(tmp_path / "ws"))
    assert MALLOC_ENV.items() <= _worker_env(cfg).items()
    with Evaluator(cfg) as ev:
        ev._ensure_worker()
        # between fork and exec (or while exec swaps the image) the kernel shows an empty environ: read again
        environ = [b""]
        for _ in range(100):
            environ = Path(f"/proc/{ev._proc.pid}/environ").read_bytes().split(b"\0")
            if environ != [b""] or ev._proc.poll() is not None:
                break
            time.sleep(0.05)
    for k, v in MALLOC_ENV.items():
        assert f"{k}={v}".encode() in environ
    assert not [e for e in environ if e.startswith((b"GLIBC_TUNABLES=", b"MALLOC_ARENA_MAX="))]
    assert "GLIBC_TUNABLES" not in _worker_env(cfg) and "MALLOC_ARENA_MAX" not in _worker_env(cfg)
