"""The timing gate (sandbox.timing_gate) and the gated figure of sandbox.timing: the pure parts and the kernel's
build run here (nvcc is on CI's machine); the gate itself on a GPU (`gpu` tests)."""

import shutil
import time

import pytest

from sandbox.config import SandboxConfig
from sandbox.reference_worker import _event_floor, gate_setup
from sandbox.timing import gated_figure
from sandbox.timing_gate import GATE_KERNEL, gate_cubin


def test_gated_figure_takes_the_largest_part():
    # GPU-bound: the events decide; host time under the allowance does not count
    assert gated_figure(0.035, 0.050, 0.090, 0.020, 0.1) == pytest.approx(0.035)
    # host work hidden behind the gate counts beyond the allowance
    assert gated_figure(0.005, 0.020, 1.000, 0.020, 0.1) == pytest.approx(0.900)
    # work on another stream that outlasts the end event counts (release to synchronised, less the latency)
    assert gated_figure(0.005, 0.500, 0.050, 0.020, 0.1) == pytest.approx(0.480)


def test_event_floor_gated_and_ungated():
    cfg = SandboxConfig(timing_gate_host_allowance_ms=0.1)
    # ungated: at least half of the in-loop wall clock, less 50 us per call
    assert _event_floor(10.0, 4, {}, cfg) == pytest.approx(5.0 - 0.2)
    # gated: half of the wall clock less the allowance and 50 us of latency per gated call
    assert _event_floor(10.0, 4, {"gated": 4}, cfg) == pytest.approx(0.5 * (10.0 - 4 * 0.15) - 0.2)
    # a forged, non-numeric `gated` is read as ungated (the stricter floor)
    assert _event_floor(10.0, 4, {"gated": "4"}, cfg) == pytest.approx(5.0 - 0.2)


def test_gate_config_is_validated():
    with pytest.raises(ValueError, match="timing_gate_timeout_ms"):
        SandboxConfig(timing_gate_timeout_ms=0)
    with pytest.raises(ValueError, match="timing_gate_host_allowance_ms"):
        SandboxConfig(timing_gate_host_allowance_ms=-1)


def test_no_gate_on_the_cpu_or_when_switched_off(tmp_path):
    assert gate_setup(SandboxConfig(cache_dir=str(tmp_path)), "cpu") is None
    assert gate_setup(SandboxConfig(cache_dir=str(tmp_path), timing_gate=False), "cuda:0") is None


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_gate_kernel_builds_with_nvcc_and_is_cached(tmp_path):
    a = gate_cubin("nvcc", "sm_90a", str(tmp_path))
    assert a is not None and GATE_KERNEL.encode() in a
    cached = list((tmp_path / "timing_gate").glob("*.cubin"))
    assert len(cached) == 1 and cached[0].read_bytes() == a
    assert gate_cubin("no-such-nvcc", "sm_90a", str(tmp_path)) is None


# ---- on a GPU


def _timer(tmp_path, gate: bool, **kw):
    import torch

    from sandbox.reference_worker import trusted_timer
    from sandbox.timing import l2_flush_buffer

    cfg = SandboxConfig(cache_dir=str(tmp_path), timing_gate=gate, **kw)
    return trusted_timer(cfg, True, "cuda:0", l2_flush_buffer(64 << 20, "cuda:0")), torch


@pytest.mark.gpu
def test_gate_keeps_host_time_out_of_the_events(tmp_path):
    """A call that spends 2 ms on the host before a short kernel: ungated, the events see the 2 ms; gated, they see
    the kernel (and the host's 2 ms counts only beyond the allowance, so about 1.9 ms)."""
    timer, torch = _timer(tmp_path, True, timing_gate_host_allowance_ms=5.0)
    assert timer.gate is not None, "the gate did not load on this GPU"
    plain, _ = _timer(tmp_path, False)
    x = torch.randn(1 << 20, device="cuda")

    def call(a):
        t = time.perf_counter()
        while time.perf_counter() - t < 0.002:
            pass
        return a * 2.0

    timer.run(call, [x] * 2, label="w")  # warm-up: the first launch of a kernel loads it (lazy loading waits)
    g = timer.run(call, [x] * 5, label="t")
    u = plain.run(call, [x] * 5, label="t")
    assert g["gated"] == 5 and g["gate_expired"] == 0
    assert u["ms_per_call"] > 1.9, u
    assert g["ms_per_call"] < 0.5, (g, u)  # a 4 MiB elementwise op: microseconds
    assert g["loop_ms"] > 5 * 1.9  # the in-loop wall clock still has the host's part

    strict, _ = _timer(tmp_path, True, timing_gate_host_allowance_ms=0.1)
    s = strict.run(call, [x] * 5, label="t")
    assert s["gated"] == 5 and s["ms_per_call"] > 1.8, s  # host time beyond the allowance counts


@pytest.mark.gpu
def test_gate_expires_when_the_call_synchronises_and_falls_back(tmp_path):
    timer, torch = _timer(tmp_path, True, timing_gate_timeout_ms=20.0)
    x = torch.randn(1024, device="cuda")

    def syncing(a):
        y = a * 2.0
        torch.cuda.synchronize()  # waits for the gate: it must give up by itself
        return y

    r = timer.run(syncing, [x] * 3, label="s")
    assert r["gate_expired"] == 2 and r["gated"] == 0, r  # two strikes, then the third call ungated
    assert "s" in timer.ungated
    assert r["ms_per_call"] >= 2 * 20.0 / 3  # the expired calls count their whole wall clock
    again = timer.run(syncing, [x] * 3, label="s")
    assert again["gated"] == 0 and again["gate_expired"] == 0 and again["ms_per_call"] < 5.0, again


@pytest.mark.gpu
def test_gate_counts_side_stream_work_that_outlasts_the_end_event(tmp_path):
    """Work on a stream of its own (not held by the gate, and not before the end event) counts through the host's
    release-to-synchronised time: the host allowance is set high so that only that rule can count it."""
    timer, torch = _timer(tmp_path, True, timing_gate_host_allowance_ms=50.0)
    side = torch.cuda.Stream()
    x = torch.randn(1 << 24, device="cuda")

    def on_side(a):
        with torch.cuda.stream(side):
            y = a
            for _ in range(100):
                y = y * 1.0001
        return y

    def on_current(a):
        y = a
        for _ in range(100):
            y = y * 1.0001
        return y

    timer.run(on_side, [x], label="w1")  # warm-up (lazy kernel loading)
    timer.run(on_current, [x], label="w2")
    s = timer.run(on_side, [x] * 3, label="side")
    c = timer.run(on_current, [x] * 3, label="cur")
    assert s["gated"] == 3 and c["gated"] == 3
    assert s["ms_per_call"] >= 0.7 * c["ms_per_call"], (s, c)
