"""Unit tests of the integrity pieces that need no evaluator: the wall-clock agreement rule, the timer's tamper
check, the precision budget, shape variants, the torch state snapshot and the monitor's attribution."""

import sys
import time

import pytest
import torch

from sandbox.evaluator import shape_variants
from sandbox.integrity import Monitor, StateSnapshot
from sandbox.timing import Timer, agree, agrees_with_estimate, charge_shortfall, trusted_estimate
from sandbox.verify import precision_shortfall


def test_agree_rejects_more_than_elapsed_and_far_less():
    assert agree(10.0, 10.4, 0.05)  # honest: the wall clock adds IPC
    assert agree(4.0, 9.0, 0.05)  # a loaded host: within the band
    assert not agree(12.0, 10.0, 0.05)  # claims more time than passed
    assert not agree(0.5, 20.0, 0.05)  # claims a fraction of the wall clock


def test_trusted_estimate_subtracts_calibrated_costs_and_caps_the_reported_prep():
    # 20 ms of wall clock, 0.3 ms round trip, 0.1 ms of harness per call x 4 calls, 2 ms of reported unpacking
    assert trusted_estimate(20.0, 0.3, 0.1, 4, 2.0, 1.0) == pytest.approx(20.0 - 0.3 - 0.4 - 2.0)
    # a candidate that reports a huge unpacking time is credited at most 3x the trusted side's packing + 0.5 ms
    assert trusted_estimate(20.0, 0.3, 0.1, 4, 19.0, 1.0) == pytest.approx(20.0 - 0.3 - 0.4 - 3.5)
    assert trusted_estimate(20.0, 0.3, 0.1, 4, float("nan"), 1.0) == pytest.approx(20.0 - 0.7)
    assert trusted_estimate(1.0, 0.3, 1.0, 4, "x", 0.0) == 0.0


def test_estimate_band_and_median_floor():
    assert agrees_with_estimate(9.0, 10.0, 9.2, 0.1)
    assert not agrees_with_estimate(11.0, 10.0, 9.2, 0.1)  # more than the raw wall clock
    assert not agrees_with_estimate(1.0, 10.0, 9.2, 0.1)  # a fraction of the estimate
    est = [10.0] * 7
    honest = [9.9, 9.8, 9.95, 6.0, 9.9, 9.85, 9.9]  # one repetition the host stole time from
    s, med, limit = charge_shortfall([f / 2 for f in honest], est, honest, 2, 0.25, 0.03)
    assert med <= limit
    # believed as they are, but for the repetition that fell short: it is charged its shortfall beyond the slack
    assert [x for i, x in enumerate(s) if i != 3] == [f / 2 for i, f in enumerate(honest) if i != 3]
    assert s[3] == pytest.approx((10.0 - limit) / 2)
    assert sorted(s)[3] == sorted(f / 2 for f in honest)[4]  # the median moves by one rank at most
    liar = [f * 0.6 for f in honest]  # 40% under-reported in every repetition
    s, med, limit = charge_shortfall([f / 2 for f in liar], est, liar, 2, 0.25, 0.03)
    assert med > limit and all(x >= (10.0 - limit) / 2 - 1e-9 for x in s)  # gains at most the slack


def test_shortfall_is_charged_not_floored_at_the_wall_clock():
    """A gated sample (20 us per call) far below its in-process wall clock (0.5 ms per call): noise that pushes the
    median shortfall just past the slack adds only the excess, it does not raise the sample to the wall clock; a
    liar that hides 1 ms per repetition outside its clock is charged all of it but the slack; a repetition already
    charged in full (a disagreement) is not charged twice."""
    calls, est = 4, [2.4] * 7
    loops = [2.0] * 7  # 0.4 ms short of the estimate in every repetition
    gated = [0.02] * 7
    noisy, med, limit = charge_shortfall(gated, est, loops, calls, 0.25, 0.03)
    assert med == pytest.approx(0.4) and med > limit
    assert all(x == pytest.approx(0.02 + (0.4 - limit) / calls) for x in noisy)
    assert max(noisy) < 0.05  # the wall clock per call would be about 0.52 ms: 26x the honest figure
    hidden = [1.0 + 0.4] * 7  # a liar's shortfall: 1 ms of work hidden outside its clock, plus the same noise
    s, med, limit = charge_shortfall(gated, est, [e - h for e, h in zip(est, hidden)], calls, 0.25, 0.03)
    assert all(x * calls >= 0.02 * calls + 1.4 - limit - 1e-9 for x in s)  # gains at most the slack
    done = [True] + [False] * 6
    s2, _, _ = charge_shortfall(gated, est, loops, calls, 0.25, 0.03, done)
    assert s2[0] == 0.02 and s2[1:] == noisy[1:]


def test_a_liar_in_just_under_half_the_repetitions_is_charged():
    """The median exploit: 20 repetitions of 16 calls (2 ms each, eager 0.125 ms per call, 3% noise); a liar hides
    almost all of its work outside its clock in 9 of them (in-process 0.2 ms: no gross disagreement, the band is
    vacuous below about 2 ms) and is honest in the other 11. A rule gated on the median repetition charged nothing:
    np.median then averaged two of the honest repetitions' lowest samples, a speed-up about 4-6% above the honest
    one's and its lower bound above the honest interval's top. Charged per repetition, it gets the honest figures
    less the slack: no better than the honest interval, give or take the slack."""
    import numpy as np

    from sandbox.stats import bootstrap_speedup

    rng = np.random.default_rng(1)
    reps, calls = 20, 16
    for _ in range(5):
        eager = list(0.125 * (1 + 0.03 * rng.standard_normal(reps)))
        hon = list(0.125 * (1 + 0.03 * rng.standard_normal(reps)))
        est = [h * calls + 0.05 for h in hon]
        loops = [h * calls for h in hon]
        liar_loops = [0.2 if i % 2 == 0 and i < 18 else f for i, f in enumerate(loops)]
        assert all(agrees_with_estimate(f, e + 0.3, e, 0.1) for f, e in zip(liar_loops, est))
        honest_s, _, limit = charge_shortfall(hon, est, loops, calls, 0.25, 0.03)
        liar_s, med, _ = charge_shortfall([f / calls for f in liar_loops], est, liar_loops, calls, 0.25, 0.03)
        assert med <= limit  # the median repetition is an honest one
        h = bootstrap_speedup(eager, honest_s, 500, 0.9)
        liar = bootstrap_speedup(eager, liar_s, 500, 0.9)
        # at most the slack (limit per repetition of 16 calls) better than the honest figures
        assert all(x >= y - limit / calls - 1e-12 for x, y in zip(liar_s, honest_s))
        assert liar.lo <= h.hi * (1 + limit / min(est)), (liar, h)


def test_trusted_estimate_subtracts_the_fixed_cost_once_per_request():
    assert trusted_estimate(20.0, 0.3, 0.1, 16, 0.0, 1.0, fixed_ms=1.5) == pytest.approx(20.0 - 0.3 - 1.5 - 1.6)
    assert trusted_estimate(20.0, 0.3, 0.1, 1, 0.0, 1.0, fixed_ms=1.5) == pytest.approx(20.0 - 0.3 - 1.5 - 0.1)
    assert trusted_estimate(20.0, 0.3, 0.1, 1, 0.0, 1.0, fixed_ms=-5.0) == pytest.approx(20.0 - 0.3 - 0.1)


def test_timer_reports_a_replaced_clock_and_its_code():
    t = Timer(cuda=False)
    assert t.tampered() == []
    real = time.perf_counter
    try:
        time.perf_counter = lambda: 0.0
        assert t.tampered() == ["time.perf_counter"]
    finally:
        time.perf_counter = real
    assert t.tampered() == []
    r = t.run(lambda a: a * 2, [torch.ones(4)] * 3)
    assert r["calls"] == 3 and r["loop_ms"] >= 0 and r["ms_per_call"] == pytest.approx(r["loop_ms"] / 3)


class _LazyFlush(torch.Tensor):
    def zero_(self):
        return self


def _shrink_flush(t: Timer, how: str) -> None:
    """In-place changes that leave the Timer's `flush` attribute the same object but flush less (or nothing)."""
    f, n = t.flush, t.flush.numel()
    if how == "set_":
        f.set_(torch.zeros(4, dtype=torch.int32))
    elif how == "resize_":
        f.resize_(4)
    elif how == "storage_resize":
        f.untyped_storage().resize_(16)
    elif how == "stride_0":  # data_ptr and numel unchanged: zero_ writes one element
        f.as_strided_((n,), (0,))
    elif how == "overlapping_strides":
        f.set_(f.untyped_storage(), 0, (n // 1024, 1024), (1, 1))
    elif how == "data_setter":
        f.data = f.as_strided((n // 1024, 1024), (1, 1))
    elif how == "instance_zero_":  # an instance attribute shadows the method
        f.zero_ = lambda: f
    elif how == "instance_lies":  # shrunk, then data_ptr and numel shadowed to report the old values
        p = f.data_ptr()
        f.set_(torch.zeros(4, dtype=torch.int32))
        f.data_ptr, f.numel = (lambda: p), (lambda: n)
    elif how == "class_swap":
        f.__class__ = _LazyFlush
    elif how == "not_a_tensor":
        t.flush = 0
    else:
        t.flush = None


@pytest.mark.parametrize("how", ["set_", "resize_", "storage_resize", "stride_0", "overlapping_strides", "data_setter",
                                 "instance_zero_", "instance_lies", "class_swap", "not_a_tensor", "none"])
def test_timer_reports_an_l2_flush_buffer_changed_in_place(how):
    """A solution that reaches the Timer could keep its `flush` attribute (the identity snapshot passes) and change
    the buffer behind it so that the flush before each call evicts little or nothing. tampered() compares the
    buffer's whole layout (read through torch._C.TensorBase, so instance attributes cannot lie), its type and its
    instance attributes with those taken at construction, and never raises (the review of session 26)."""
    t = Timer(cuda=False, flush=torch.zeros(1 << 16, dtype=torch.int32))
    assert t.tampered() == []
    _shrink_flush(t, how)
    assert t.tampered() == ["timing.Timer.flush"]


def test_timer_keeps_the_flush_storage_of_a_re_pointed_buffer():
    """The gate zeroes the address taken at construction: a buffer re-pointed elsewhere does not free it."""
    t = Timer(cuda=False, flush=torch.zeros(4096, dtype=torch.int32))
    ptr = t.flush.data_ptr()
    t.flush.set_(torch.zeros(4, dtype=torch.int32))
    assert t._flush_keep.data_ptr() == ptr and t._flush_keep.nbytes() == 4096 * 4


def test_precision_budget_tells_fp32_from_bf16_rounding():
    ref = torch.randn(4096) * 3 + 1
    fp32_other_order = (ref.double() + 1e-7 * torch.randn(4096).double()).float()
    bf16 = ref.bfloat16().float()
    budget = {"float32": 1e-4}
    assert precision_shortfall(ref, fp32_other_order, budget) == ""
    assert precision_shortfall(ref, bf16, budget).startswith("precision: output: median relative error")
    assert torch.allclose(bf16, ref, atol=1e-2, rtol=1e-2)  # the tolerance alone would pass it


def test_shape_variants_are_odd_and_smaller():
    assert shape_variants({"batch_size": 64, "dim": 16384}) == [{"batch_size": 33, "dim": 8193}]
    assert shape_variants({"n": 1}) == []
    assert shape_variants({}) == []


def test_state_snapshot_puts_flags_back_and_names_replaced_functions():
    snap = StateSnapshot()
    prec = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("medium" if prec != "medium" else "high")
    changed = snap.restore_flags()
    assert torch.get_float32_matmul_precision() == prec and any("float32_matmul_precision" in c for c in changed)
    real = torch.relu
    try:
        torch.relu = lambda x: x
        assert "torch.relu" in snap.replaced()
    finally:
        torch.relu = real
    assert snap.replaced() == []


def test_monitor_attributes_events_to_workspace_code(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "probe_mod.py").write_text("import os\ndef peek():\n    return os.sys._getframe(0)\n")
    sys.path.insert(0, str(ws))
    try:
        m = Monitor(str(ws), "cpu", set(), set())
        import probe_mod

        m.phase = "call"
        # called as the audit hook would be: the event raised from probe_mod's frame
        assert m._judge.__name__ == "_judge"
        sys.addaudithook(m._hook)
        with pytest.raises(ImportError, match="sys._getframe"):
            probe_mod.peek()
        assert m.violations and m.violations[0][0] == "introspection"
        m.phase = "harness"
        sys._getframe(0)  # harness code, harness phase: nothing recorded
        assert len(m.violations) == 1
    finally:
        m.phase = "harness"
        sys.path.remove(str(ws))


_HARNESS_PHASE_PROBE = r'''
import inspect, sys
ws = sys.argv[1]
sys.path.insert(0, ws)
from sandbox.integrity import Monitor
m = Monitor(ws, "cpu", set(), set())
import probe_mod
sys.addaudithook(m._hook)
reads = []
sys.addaudithook(lambda e, a: reads.append(1) if e == "object.__getattr__" and a[1] == "f_code" else None)
out = {}
for name in ("peek", "via_inspect"):  # the solution's frames, run from the harness in the harness phase
    try:
        getattr(probe_mod, name)()
        out[name] = None
    except ImportError as e:
        out[name] = str(e)
def deep(n):
    if n:
        return deep(n - 1)
    reads.clear()
    sys._getframe(0)  # harness code 60 frames down: judged from its own frame, no walk of the stack
    return len(reads)
out["f_code_reads"] = deep(60)
out["kinds"] = [k for k, _ in m.violations]
print(out)
'''


def test_monitor_judges_caller_ruled_events_without_walking_the_stack(tmp_path):
    """In the harness phase, sys._getframe (every import runs one) is judged from the frame that raised it; the
    solution calling it, or a frame helper (inspect) calling it for the solution, is still caught."""
    import ast
    import subprocess

    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "probe_mod.py").write_text("import inspect, sys\ndef peek():\n    return sys._getframe(0)\n"
                                     "def via_inspect():\n    return inspect.currentframe()\n")
    p = subprocess.run([sys.executable, "-c", _HARNESS_PHASE_PROBE, str(ws)], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    out = ast.literal_eval(p.stdout.strip().splitlines()[-1])
    assert "sys._getframe called by the solution" in out["peek"]
    assert "for the solution by inspect.py" in out["via_inspect"]
    assert out["kinds"] == ["introspection", "introspection"]
    assert out["f_code_reads"] <= 2  # the raising frame's code (a walk would read 60+)


def test_thread_check_leaves_no_reference_cycle_holding_its_callers_locals(tmp_path):
    """python_threads_in_workspace (run by the candidate's `sample` after every timed repetition) must not keep its
    callers' frames alive: sys._current_frames() holds the calling frame itself, and kept in a local it made a cycle
    that held `sample`'s locals (a repetition's outputs) until the cyclic collector ran. Each timed call then got
    fresh heap pages (elementwise_chain x4 on the CPU box: 7-40x slower repetitions and lost rewards)."""
    import gc
    import weakref

    from sandbox.integrity import python_threads_in_workspace

    m = Monitor(str(tmp_path), "cpu", set(), set())

    def caller() -> weakref.ref:
        held = torch.empty(4)  # a local of the caller, as the repetition's outputs are in `sample`
        assert python_threads_in_workspace(m) == []
        return weakref.ref(held)

    on = gc.isenabled()
    gc.disable()  # as in the candidate between requests: only reference counting frees anything
    try:
        ref = caller()
        assert ref() is None, "the caller's locals outlived it (a reference cycle through its frame)"
    finally:
        if on:
            gc.enable()


def test_harness_part_of_the_slack_widens_the_limit_by_exactly_its_amount():
    """charge_shortfall's harness_ms (SandboxConfig.timing_slack_harness_rel x the calibrated harness cost): the
    limit grows by it; an honest repetition that fell short by less than the wider limit is no longer charged; a
    liar hiding 1 ms still pays all of it but the (wider) slack. Config: bad values named."""
    from sandbox.config import SandboxConfig

    calls, est = 3, [1.8] * 7
    loops = [1.4] * 7  # an honest 0.4 ms short in every repetition (the H200's harness gap, session 12)
    gated = [0.075] * 7
    narrow, _, lim0 = charge_shortfall(gated, est, loops, calls, 0.25, 0.03)
    wide, _, lim1 = charge_shortfall(gated, est, loops, calls, 0.25, 0.03, harness_ms=0.25 * 1.8)
    assert lim1 == pytest.approx(lim0 + 0.45)
    assert all(x > 0.075 for x in narrow) and wide == gated
    hidden = [e - 1.4 for e in est]  # 1 ms hidden on top of the honest gap
    s, _, _ = charge_shortfall(gated, est, hidden, calls, 0.25, 0.03, harness_ms=0.45)
    assert all(x * calls == pytest.approx(0.075 * calls + 1.4 - lim1) for x in s)
    assert charge_shortfall(gated, est, loops, calls, 0.25, 0.03, harness_ms=-1.0)[2] == pytest.approx(lim0)
    with pytest.raises(ValueError, match="timing_slack_harness_rel must be in"):
        SandboxConfig(timing_slack_harness_rel=1.5)


def test_persisting_l2_reset_sets_the_limit_only_when_it_is_not_zero():
    """sandbox.timing.PersistingL2.reset with the driver calls replaced by recorders (no GPU here): the persisting
    lines are reset every time; the set-aside limit is set to 0 when the query reads a limit above 0 or fails,
    and left alone when it reads 0. The parts record gets both steps."""
    from sandbox.timing import PersistingL2

    p = PersistingL2()
    calls: list = []
    state = {"limit": 0, "rc": 0}

    def get(ref, which):
        calls.append(("get", which))
        p._value.value = state["limit"]
        return state["rc"]

    p._get, p._ref = get, None
    p._limit = lambda which, v: calls.append(("set", which, v))
    p._reset = lambda: calls.append(("reset",))
    p.available = True
    lim = PersistingL2.CU_LIMIT_PERSISTING_L2_CACHE_SIZE
    parts: dict = {}
    p.reset(parts, time.perf_counter)
    assert calls == [("get", lim), ("reset",)] and set(parts) == {"l2_limit", "l2_reset"}
    p.reset(parts)  # no clock given: nothing timed
    assert calls[2:] == [("get", lim), ("reset",)]
    calls.clear()
    state["limit"] = 4 << 20  # a set-aside the solution left
    p.reset()
    assert calls == [("get", lim), ("set", lim, 0), ("reset",)]
    calls.clear()
    state.update(limit=0, rc=1)  # the query failed: set, as before the query existed
    p.reset()
    assert calls == [("get", lim), ("set", lim, 0), ("reset",)]


def test_identity_snapshot_sees_a_foreign_function_changed_in_place():
    """A ctypes function the harness keeps (PersistingL2's driver calls, the gate's launch) can be changed without
    being replaced: its errcheck (solution code run on every call), restype or argtypes, the argtypes list even in
    place. The snapshot names each; untouched, it names nothing."""
    import ctypes

    from sandbox.integrity import IdentitySnapshot

    class Holder:
        pass

    for change in ("errcheck", "restype", "argtypes", "argtypes_in_place"):
        lib = ctypes.CDLL(None)
        h = Holder()
        h.fn = lib.getpid  # a fresh function object per CDLL
        h.fn.argtypes = []
        snap = IdentitySnapshot()
        snap.add_attrs(h, ["fn"], "H")
        assert snap.replaced() == []
        if change == "errcheck":
            h.fn.errcheck = lambda result, func, args: 0
        elif change == "restype":
            h.fn.restype = ctypes.c_long
        elif change == "argtypes":
            h.fn.argtypes = [ctypes.c_int]
        else:
            h.fn.argtypes.append(ctypes.c_int)
        assert snap.replaced() == ["H.fn (its errcheck, restype or argtypes)"], change


def test_liar_at_the_default_config_gains_at_most_the_default_slack():
    """The production defaults (SandboxConfig(), the harness part on) with one of the H200's calibrations (session
    13: fixed 1.03 ms + 0.227 ms a call, 3 calls): an honest repetition 0.5 ms short (the harness's own slowdown) is
    not charged; a liar hiding h ms outside its clock in every repetition is charged exactly h less the default slack
    whenever h exceeds it, so its per-call figure never drops below the honest one by more than slack / calls."""
    from sandbox.config import SandboxConfig

    cfg = SandboxConfig()
    calls, fixed, per_call = 3, 1.03, 0.227
    harness = cfg.timing_slack_harness_rel * (fixed + calls * per_call)
    assert harness > 0  # the part is on by default
    honest_ms, est = 0.076, 0.076 * calls + 0.5
    slack = cfg.timing_slack_ms + cfg.timing_slack_rel * est + harness
    honest, _, lim = charge_shortfall([honest_ms] * 8, [est] * 8, [est - 0.5] * 8, calls, cfg.timing_slack_ms,
                                      cfg.timing_slack_rel, harness_ms=harness)
    assert lim == pytest.approx(slack) and honest == [honest_ms] * 8
    for hidden in (0.2, 1.0, 5.0):  # the liar reports the honest figure and hides `hidden` ms of its real work
        est_l = est + hidden
        s, _, _ = charge_shortfall([honest_ms] * 8, [est_l] * 8, [est - 0.5] * 8, calls, cfg.timing_slack_ms,
                                   cfg.timing_slack_rel, harness_ms=harness)
        slack_l = cfg.timing_slack_ms + cfg.timing_slack_rel * est_l + harness
        true_ms = honest_ms + hidden / calls
        charge = max(0.0, hidden + 0.5 - slack_l) / calls
        assert s == pytest.approx([honest_ms + charge] * 8)
        assert true_ms - s[0] <= slack_l / calls + 1e-9  # what it gains, per call, is bounded by the slack


def _code_swap_module():
    """A fresh module of three plain functions and a class, for IdentitySnapshot's code checks."""
    import types as _types

    mod = _types.ModuleType("code_swap_probe")
    exec("def a():\n    return 1\n\ndef b():\n    return 2\n\ndef c():\n    return 3\n\n"
         "class K:\n    def m(self):\n        return 4\n", mod.__dict__)
    return mod


@pytest.mark.parametrize("attack", ["swap_one", "swap_two_with_each_other", "swap_and_keep_the_old_in_doc",
                                    "method_code", "none"])
def test_identity_snapshot_sees_every_code_swap_through_its_batched_check(attack):
    """IdentitySnapshot's code check reads no __code__ while nothing changed (one gc.get_referents over every
    function: sandbox.integrity.CodeCheck). Each way of swapping code objects must still be named: one function's,
    two functions' exchanged (the set of code objects unchanged), one whose old code is kept in its own __doc__
    (the count of code objects unchanged for that function's neighbours), a class's method."""
    from sandbox.integrity import CodeCheck, IdentitySnapshot

    mod = _code_swap_module()
    snap = IdentitySnapshot()
    snap.add_module(mod, deep=True)
    assert snap.replaced() == []
    expected: set[str] = set()
    if attack == "swap_one":
        mod.a.__code__ = (lambda: 9).__code__
        expected = {"code_swap_probe.a"}
    elif attack == "swap_two_with_each_other":
        mod.a.__code__, mod.b.__code__ = mod.b.__code__, mod.a.__code__
        expected = {"code_swap_probe.a", "code_swap_probe.b"}
    elif attack == "swap_and_keep_the_old_in_doc":
        old = mod.c.__code__
        mod.c.__doc__ = old
        mod.c.__code__ = (lambda: 9).__code__
        expected = {"code_swap_probe.c"}
    elif attack == "method_code":
        mod.K.m.__code__ = (lambda self: 9).__code__
        expected = {"code_swap_probe.K.m"}
    assert set(snap.replaced()) == expected
    fresh = _code_swap_module()
    fns = [fresh.a, fresh.b, fresh.c, fresh.K.m]
    check = CodeCheck(fns, [f.__code__ for f in fns])
    assert check.unchanged()
    fresh.b.__doc__ = fresh.b.__code__  # a code object among the referents: "changed" (the caller then looks closely)
    assert not check.unchanged()


def test_state_snapshot_sees_a_torch_function_code_swap():
    """StateSnapshot's batched code check (CodeCheck) on torch's own Python functions."""
    snap = StateSnapshot()
    assert snap.replaced() == []
    fn = torch.nn.functional.gelu if hasattr(torch.nn.functional.gelu, "__code__") else torch.nn.functional.dropout
    name = [k for k, e in snap.callables.items() if e[2] is fn][0]
    real = fn.__code__
    try:
        fn.__code__ = (lambda *a, **k: a[0]).__code__
        assert name in snap.replaced()
    finally:
        fn.__code__ = real
    assert snap.replaced() == []


_GRAPH_REPLAY_PROBE = r'''
import sys, types
ws = sys.argv[1]
from sandbox.integrity import Monitor, count_graph_replays
m = Monitor.install(ws, "cubin", set(), set())
ran = []
class Graph:  # stands in for torch._C._CUDAGraph (a CPU build of torch has no replay)
    def replay(self):
        ran.append(self)
    def capture_begin(self):
        pass
cur = types.SimpleNamespace(cuda_stream=7)
count_graph_replays(m, Graph, lambda: cur.cuda_stream)
wrapped = Graph.replay
count_graph_replays(m, Graph, lambda: cur.cuda_stream)  # installed twice: wrapped once
g = Graph()
g.replay()
cur.cuda_stream = 9
g.replay()
Graph.replay(g)
count_graph_replays(m, None, lambda: cur.cuda_stream)  # no such class: nothing happens
print({"ran": len(ran), "streams": m.launch_streams, "once": Graph.replay is wrapped, "launches": m.launches,
       "guarded": getattr(Graph.replay, "_cuda_agent_guard", False)})
'''


def test_monitor_counts_cuda_graph_replays_on_the_stream_they_go_to(tmp_path):
    """A CUDA graph's replay launches kernels with no launch of the launcher's and no torch op: the monitor's wrapper
    of torch._C._CUDAGraph.replay counts each replay in launch_streams under the current stream, so the timing gate
    counts a call that replays a graph on another stream in full (the real class: tests/integrity/test_integrity_gpu.py,
    gpu_graph_side_stream). The replay still runs; no kernel launch is counted for it."""
    import ast
    import subprocess

    p = subprocess.run([sys.executable, "-c", _GRAPH_REPLAY_PROBE, str(tmp_path)], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    out = ast.literal_eval(p.stdout.strip().splitlines()[-1])
    assert out == {"ran": 3, "streams": {7: 1, 9: 2}, "once": True, "launches": {}, "guarded": True}


_GRAPH_WIRING_PROBE = r'''
import sys
import torch
from sandbox.integrity import Monitor, install_torch_wrappers
m = Monitor.install(sys.argv[1], "cubin", set(), set())
ran, where = [], [5]
# a CUDA build's pieces on this CPU build: the graph classes' replay and the builtins the stream is read through
for name in ("_CUDAGraph", "_acceleratorGraph"):
    cls = getattr(torch._C, name, None)
    if cls is not None:
        setattr(cls, "replay", lambda self, _n=name: ran.append(_n))
torch._C._cuda_getCurrentRawStream = lambda device: where[0] + 100 * device
torch._C._cuda_getDevice = lambda: 0
install_torch_wrappers(m)
torch._C._cuda_getCurrentRawStream = lambda device: 5  # rebound after the install: not what the monitor reads
where[0] = 8
torch._C._CUDAGraph.replay(object())
acc = getattr(torch._C, "_acceleratorGraph", None)
if acc is not None:
    acc.replay(object())
print({"ran": ran, "streams": m.launch_streams, "acc": acc is not None})
'''


def test_install_torch_wrappers_counts_replays_of_every_graph_class(tmp_path):
    """install_torch_wrappers wraps the replay of torch.cuda.CUDAGraph's C base (and torch.accelerator.Graph's,
    where torch has it) and reads the stream through the builtins it bound at install (raw_stream_reader): a later
    rebinding of torch._C._cuda_getCurrentRawStream does not change what is counted. On this CPU build the methods
    and builtins are stand-ins set before the install."""
    import ast
    import subprocess

    p = subprocess.run([sys.executable, "-c", _GRAPH_WIRING_PROBE, str(tmp_path)], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    out = ast.literal_eval(p.stdout.strip().splitlines()[-1])
    expect = ["_CUDAGraph"] + (["_acceleratorGraph"] if out["acc"] else [])
    assert out["ran"] == expect and out["streams"] == {8: len(expect)}


_WHILE_BUSY_PROBE = r'''
import gc, sys
ws = sys.argv[1]
sys.path.insert(0, ws)
from sandbox.integrity import IntegrityError, Monitor
m = Monitor.install(ws, "cpu", set(), set())
import busy_mod
out = {}
m._busy = True  # as while the monitor judges an event or makes a wrapped call
try:
    gc.get_objects()  # harness code (no frame of the solution's newer than the monitor's): let through
    out["harness"] = "passed"
    try:
        busy_mod.grab()  # the solution's code, run while busy (a function the monitor called, rebound)
        out["solution"] = "passed"
    except IntegrityError as e:
        out["solution"] = str(e)
finally:
    m._busy = False
out["kinds"] = [k for k, _ in m.violations]
print(out)
'''


def test_monitor_refuses_the_solutions_events_while_busy(tmp_path):
    """Monitor._while_busy: while the monitor is busy, a ruled event raised by a frame of the solution's (here
    gc.get_objects, the way to the monitor and the originals it keeps) is refused as harness_tampering; the same
    event from harness code passes."""
    import ast
    import subprocess

    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "busy_mod.py").write_text("import gc\ndef grab():\n    return len(gc.get_objects())\n")
    p = subprocess.run([sys.executable, "-c", _WHILE_BUSY_PROBE, str(ws)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    out = ast.literal_eval(p.stdout.strip().splitlines()[-1])
    assert out["harness"] == "passed"
    assert "raised by the solution's code while the sandbox's monitor was busy" in out["solution"]
    assert out["kinds"] == ["harness_tampering"]
