"""The timing gate (sandbox.timing_gate) and the gated figure of sandbox.timing: the pure parts and the kernel's
build run here (nvcc is on CI's machine); the gate itself on a GPU (`gpu` tests)."""

import ctypes
import shutil
import time

import pytest
import torch

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
    # with the gate's L2 flush, the trusted side's measured latency (never below 50 us)
    assert _event_floor(10.0, 4, {"gated": 4}, cfg, gate_latency_ms=0.2) == pytest.approx(0.5 * (10.0 - 4 * 0.3) - 0.2)
    floor = _event_floor(10.0, 4, {"gated": 4}, cfg, gate_latency_ms=0.01)
    assert floor == pytest.approx(0.5 * (10.0 - 4 * 0.15) - 0.2)
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
    # the extension format is timed ungated (baselines too) unless asked for
    assert gate_setup(SandboxConfig(cache_dir=str(tmp_path)), "cuda:0", "extension") is None


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


# ---- the gated loop of sandbox.timing.Timer with a fake CUDA (the policy, not the GPU)


class _FakeStream:
    def __init__(self, handle: int, device_index: int = 0):
        self.cuda_stream = handle
        self.device_index = device_index


class _FakeCuda:
    """torch.cuda's synchronize / Event / current_stream / set_stream for the Timer, on a fake clock (seconds):
    sync() advances it by `sync_s`; events read `event_ms` apart."""

    def __init__(self, monkeypatch, sync_s: float, event_ms: float):
        import torch

        self.clock = [0.0]
        self.sync_s = sync_s
        self.default = _FakeStream(0)
        self.current = self.default
        self.recorded: list = []  # (event, stream) per record
        fake = self

        class Event:
            def __init__(self, enable_timing: bool = False):
                self.t = None

            def record(self, stream=None):
                fake.recorded.append((self, stream if stream is not None else fake.current))

            def elapsed_time(self, other):
                return event_ms

            def synchronize(self):
                pass

        def synchronize(device=None):
            fake.clock[0] += fake.sync_s

        def current_stream(device=None):
            return fake.current

        def set_stream(stream):
            fake.current = stream

        for name, v in (("synchronize", synchronize), ("Event", Event), ("current_stream", current_stream),
                        ("set_stream", set_stream)):
            monkeypatch.setattr(torch.cuda, name, v)

    def perf(self) -> float:
        return self.clock[0]


class _FakeGate:
    def __init__(self, device: int = 0, expire: bool = False):
        self.device = device
        self.closed: list = []
        self.flushes: list = []  # (flush_ptr, flush_bytes) or () per close
        self.opened = 0
        self._expire = expire

    def close(self, stream: int, *flush: int) -> None:
        self.closed.append(stream)
        self.flushes.append(flush)

    def open(self) -> None:
        self.opened += 1

    def expired(self) -> bool:
        return self._expire


def _fake_timer(monkeypatch, sync_s=0.0003, event_ms=0.1, gate=None, lat=0.02, allow=1.0):
    from sandbox.timing import Timer

    fake = _FakeCuda(monkeypatch, sync_s, event_ms)
    gate = gate or _FakeGate()
    t = Timer(True, None, gate, allow)
    t._perf = fake.perf
    t.gate_latency_ms = lat
    gate.closed.clear()  # the latency calibration's own gates
    gate.opened = 0
    return t, fake, gate


def test_gated_loop_records_both_events_on_the_held_stream_and_subtracts_the_latency(monkeypatch):
    t, fake, gate = _fake_timer(monkeypatch)
    fake.recorded.clear()
    r = t.run(lambda a: a, [1, 2, 3], label="c")
    assert r["gated"] == 3 and gate.closed == [0, 0, 0] and gate.opened == 3
    assert all(st is fake.default for _, st in fake.recorded)
    # per call: max(events 0.1, release-to-synchronised 0.3 - latency 0.02, host 0 - 1) = 0.28
    assert r["ms_per_call"] == pytest.approx(0.28)


class _CountingFlush(torch.Tensor):
    """A 4 MiB CPU tensor standing in for the L2 flush buffer (the Timer records its layout): zero_() is counted and
    does nothing."""

    def zero_(self):
        self.zeroed += 1
        return self


def _FakeFlush() -> _CountingFlush:
    f = torch.empty(1 << 20, dtype=torch.int32).as_subclass(_CountingFlush)
    f.zeroed = 0
    return f


def test_gated_calls_flush_l2_in_the_gate_after_its_release_and_ungated_ones_before(monkeypatch):
    """With a gate, the flush buffer goes to every gate launch (it is zeroed after the release, so what a copy engine
    read into L2 while the gate held the stream is evicted before the start event) and is not zeroed before the call
    as well; the gate latency is measured with the flush in (it is the gate's time, not the call's), within 50 us
    plus twice a plain flush. Without a gate (or another device's), the flush runs before the call as before."""
    from sandbox.timing import Timer

    fake = _FakeCuda(monkeypatch, 0.0, 0.1)
    off_gate, off_flush = _FakeGate(), _FakeFlush()
    off = Timer(True, off_flush, off_gate, 1.0)  # SandboxConfig.timing_gate_flush off: the flush before each call
    off._perf = fake.perf
    assert off.run(lambda a: a, [1, 2], label="c")["gated"] == 2 and off_flush.zeroed == 2
    assert off_gate.flushes and all(f == () for f in off_gate.flushes)
    gate, flush = _FakeGate(), _FakeFlush()
    t = Timer(True, flush, gate, 1.0, gate_flush=True)
    assert gate.flushes and all(f == (flush.data_ptr(), 4 << 20) for f in gate.flushes)  # the latency's gates
    assert flush.zeroed == 3  # the plain flushes that bound the latency
    assert t.gate_latency_ms == pytest.approx(0.005)  # fake: empty calls take no time
    t._perf = fake.perf
    gate.flushes.clear()
    r = t.run(lambda a: a, [1, 2, 3], label="c")
    assert r["gated"] == 3 and gate.flushes == [(flush.data_ptr(), 4 << 20)] * 3 and flush.zeroed == 3
    other, oflush = _FakeGate(device=1), _FakeFlush()
    u = Timer(True, oflush, other, 1.0, gate_flush=True)
    u._perf = fake.perf
    zeroed = oflush.zeroed
    assert u.run(lambda a: a, [1, 2], label="c")["gated"] == 0 and oflush.zeroed == zeroed + 2
    # a gate that expired twice: the rest of that label's calls run ungated, with the flush before each call again
    egate, eflush = _FakeGate(expire=True), _FakeFlush()
    ex = Timer(True, eflush, egate, 1.0, gate_flush=True)
    ex._perf = fake.perf
    zeroed = eflush.zeroed
    r = ex.run(lambda a: a, [1, 2, 3, 4], label="c")
    assert r["gate_expired"] == 2 and eflush.zeroed == zeroed + 2  # calls 3 and 4 ungated, flushed before
    # the latency's cap: 50 us plus twice a plain flush's event time (the fake's events: 0.1 ms)
    slow = _FakeCuda(monkeypatch, 0.001, 0.1)  # every sync 1 ms: an empty gated call's latency far above any cap
    capped = Timer(True, _FakeFlush(), _FakeGate(), 1.0, gate_flush=True)
    capped._perf = slow.perf
    assert capped.calibrate_gate() == pytest.approx(0.05 + 2 * 0.1)
    plain_flush = _FakeFlush()
    assert Timer(True, plain_flush, None).run(lambda a: a, [1, 2])["calls"] == 2 and plain_flush.zeroed == 2


def test_gated_call_that_leaves_another_stream_current_is_put_back_and_counted_in_full(monkeypatch):
    """A forward that switches torch's current stream and leaves it so: the end event would land on a stream that
    carries none of its work (events ~0, the figure then the release-to-synchronised time less the latency); it is
    recorded on the held stream, the stream is put back, and the call counts its whole wall clock."""
    t, fake, gate = _fake_timer(monkeypatch, event_ms=0.001)
    side = _FakeStream(77)

    def leaves_side(a):
        fake.clock[0] += 0.0005  # 0.5 ms on the host (under the allowance)
        fake.current = side
        return a

    fake.recorded.clear()
    r = t.run(leaves_side, [1, 2], label="c")
    assert fake.current is fake.default  # put back
    assert gate.closed == [0, 0]  # the next gate went on the stream the call was made on, not the solution's
    assert all(st is fake.default for _, st in fake.recorded)
    assert r["ms_per_call"] == pytest.approx(0.8)  # host 0.5 + release to synchronised 0.3
    assert r["gate_side"] == 2 and r["gated"] == 0


def test_gated_call_that_raises_opens_the_gate_and_puts_the_stream_back(monkeypatch):
    t, fake, gate = _fake_timer(monkeypatch)
    side = _FakeStream(5)

    def bad(a):
        fake.current = side
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        t.run(bad, [1], label="c")
    assert gate.opened == 1 and fake.current is fake.default


def test_gate_of_another_device_times_ungated(monkeypatch):
    t, fake, gate = _fake_timer(monkeypatch, gate=_FakeGate(device=1))
    r = t.run(lambda a: a, [1, 2], label="c")
    assert r["gated"] == 0 and gate.closed == []


def test_expiries_of_one_label_do_not_ungate_another(monkeypatch):
    t, fake, gate = _fake_timer(monkeypatch, gate=_FakeGate(expire=True))
    r = t.run(lambda a: a, [1, 2, 3], label="calibrate")
    assert r["gate_expired"] == 2 and "calibrate" in t.ungated
    assert "" not in t.ungated


def test_timer_reports_a_replaced_set_stream(monkeypatch):
    import torch

    t, fake, gate = _fake_timer(monkeypatch)
    assert t.tampered() == []
    monkeypatch.setattr(torch.cuda, "set_stream", lambda s: None)
    assert "torch.cuda.set_stream" in t.tampered()


def test_candidate_times_calibrate_under_a_label_of_its_own():
    """The candidate's calibrate requests (trusted no-op, before load) must not spend the solution's two strikes."""
    import inspect

    from sandbox.candidate import Worker

    src = inspect.getsource(Worker._timed_calls)
    assert 'label="" if fn is None else "calibrate"' in src


def test_gate_source_waits_for_equality_with_a_random_value():
    """The gate's words can be written by a solution's kernel: its waits compare for equality with a value drawn
    at random per launch (a value set ahead, e.g. `release` far past a counter, never matches)."""
    from sandbox import timing_gate

    assert "*flag != want" in timing_gate.GATE_SOURCE and "*release != want" in timing_gate.GATE_SOURCE
    assert "- want) < 0" not in timing_gate.GATE_SOURCE
    g = timing_gate.Gate.__new__(timing_gate.Gate)
    import ctypes

    words = (ctypes.c_uint32 * 2)()
    g._flag, g._expired = ctypes.c_uint32.from_buffer(words, 0), ctypes.c_uint32.from_buffer(words, 4)
    seq = iter([b"\x00\x00\x00\x00", b"\x07\x00\x00\x00", b"\x07\x00\x00\x00", b"\x09\x00\x00\x00"])
    g._rand = lambda n: next(seq)
    g._want = 0
    assert g._next_want() == 7  # 0 is the words' current value: drawn again
    g._want = 7
    assert g._next_want() == 9  # the last gate's value is never reused


# ---- on a GPU: what a solution's work can do while the gate is held


def _done_while_held(gate, torch, enqueue, hold_s: float = 0.005) -> bool:
    """Close the gate on the current stream, enqueue(side stream) some work, and poll (never wait) for an event
    after that work for hold_s seconds with the gate held: whether it completed while held."""
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    gate.close(torch.cuda.current_stream().cuda_stream)
    with torch.cuda.stream(side):
        enqueue()
        ev = torch.cuda.Event()
        ev.record(side)
    t = time.perf_counter()
    done = False
    while time.perf_counter() - t < hold_s and not done:
        done = ev.query()
    gate.open()
    torch.cuda.synchronize()
    return done


@pytest.mark.gpu
def test_no_kernel_of_another_stream_runs_while_the_gate_is_held(tmp_path):
    timer, torch = _timer(tmp_path, True)
    gate = timer.gate
    x = torch.randn(1 << 20, device="cuda")
    y = x * 2.0  # loaded now (lazy loading inside the hold would wait for the gate)
    torch.cuda.synchronize()
    assert not _done_while_held(gate, torch, lambda: y.mul_(2.0))
    assert not gate.expired()


@pytest.mark.gpu
def test_a_release_word_set_ahead_does_not_free_the_sms(tmp_path):
    """A solution's kernel can write any address of its context: were `release` compared by order with a counter, a
    value written far ahead (here with cuMemsetD32, as the harness's own handle) would let every block but the first
    exit at once, and the solution's side-stream kernels would run on the freed SMs while the host enqueues."""
    import ctypes

    timer, torch = _timer(tmp_path, True)
    gate = timer.gate
    x = torch.randn(1 << 20, device="cuda")
    y = x * 2.0
    torch.cuda.synchronize()
    lib = gate._lib
    assert lib.cuMemsetD32_v2(ctypes.c_uint64(gate._a_release.value), ctypes.c_uint(0x7FFFFFF0), 1) == 0
    torch.cuda.synchronize()
    assert not _done_while_held(gate, torch, lambda: y.mul_(2.0))


@pytest.mark.gpu
def test_the_gate_caches_no_driver_function_on_the_launchers_handle(tmp_path):
    """sandbox.runtime's libcuda handle is within a solution's reach; a function looked up on it stays callable
    without the monitor's symbol rule: the gate's memory calls are looked up on a handle of its own."""
    from sandbox import runtime

    timer, torch = _timer(tmp_path, True)
    assert timer.gate is not None
    cached = set(vars(runtime._get_driver().lib))
    assert not cached & {"cuMemAlloc_v2", "cuMemsetD32_v2", "cuMemHostAlloc", "cuMemHostGetDevicePointer_v2",
                         "cuModuleLoadData", "cuDeviceGetAttribute", "cuOccupancyMaxActiveBlocksPerMultiprocessor"}


@pytest.mark.gpu
def test_the_gate_zeroes_the_flush_buffer_after_its_release(tmp_path):
    """The gate's L2 flush: a buffer of ones is zero after a gated call, and the gate latency includes the flush
    (more than an empty gate's few microseconds on a 64 MiB buffer) within its cap."""
    timer, torch = _timer(tmp_path, True, timing_gate_flush=True)
    assert timer.gate is not None and timer._gate_flush, "the gate did not load on this GPU"
    timer.flush.fill_(1)
    torch.cuda.synchronize()
    x = torch.randn(1 << 16, device="cuda")
    r = timer.run(lambda a: a * 2.0, [x] * 2, label="z")
    assert r["gated"] == 2
    assert int(timer.flush.abs().sum().item()) == 0
    plain, _ = _timer(tmp_path, True, timing_gate_flush=False)  # the same gate without its flush
    print(f"gate latency with a 64 MiB flush: {timer.gate_latency_ms * 1e3:.1f} us, without: "
          f"{plain.gate_latency_ms * 1e3:.1f} us")
    assert plain.gate_latency_ms < timer.gate_latency_ms


@pytest.mark.gpu
@pytest.mark.xfail(strict=False, reason="copy engines are not held by the gate: a copy on another stream runs while "
                                        "the host enqueues (what it reads into L2 is evicted by the gate's flush after "
                                        "the release: test_inputs_read_by_a_copy_while_held_do_not_make_the_call_"
                                        "faster). XPASS: this kind of copy uses the SMs")
@pytest.mark.parametrize("kind", ["d2d", "d2h"])
def test_copy_engine_work_of_another_stream_does_not_run_while_the_gate_is_held(tmp_path, kind):
    timer, torch = _timer(tmp_path, True)
    src = torch.randn(16 << 20, device="cuda")
    dst = torch.empty_like(src) if kind == "d2d" else torch.empty(src.shape, dtype=src.dtype, pin_memory=True)
    dst.copy_(src)
    torch.cuda.synchronize()
    assert not _done_while_held(timer.gate, torch, lambda: dst.copy_(src, non_blocking=True))


@pytest.mark.gpu
@pytest.mark.parametrize("reported,gate_flush", [(False, True), (False, False), (True, False)])
def test_inputs_read_by_a_copy_while_held_do_not_make_the_call_faster(tmp_path, reported, gate_flush, request):
    """A copy to pinned host memory on another stream, while the gate is held, reads the inputs into L2 again after
    the flush; a memory-bound kernel would then read them from L2 on the clock. The candidate's harness reports
    such a call (the copies are torch ops dispatched under another stream: Timer.side_work), which then counts its
    whole wall clock. Unreported (the Timer's own bound, for a route the harness would not see; in the cubin
    format launches, CUDA graph replays and torch ops are counted by stream, and the driver's symbols are refused
    to the solution), the gate's own L2 flush after its release (SandboxConfig.timing_gate_flush) evicts what the
    copies read; without it, an open hole (xfail)."""
    if not reported and not gate_flush:
        request.applymarker(pytest.mark.xfail(strict=False, reason="open unless SandboxConfig.timing_gate_flush: copy "
                                                                   "engines are not held by the gate"))
    timer, torch = _timer(tmp_path, True, timing_gate_flush=gate_flush)
    side = torch.cuda.Stream()
    n = 4 << 20  # 16 MiB of float32: well inside an H200's L2
    x = torch.randn(n, device="cuda")
    sink = torch.empty(1 << 18, dtype=torch.float32, pin_memory=True)

    def plain(a):
        return a * 2.0

    def prefetch(a):
        with torch.cuda.stream(side):
            for i in range(0, n, sink.numel()):
                sink.copy_(a[i:i + sink.numel()], non_blocking=True)
            ev = torch.cuda.Event()
            ev.record(side)
        if reported:
            timer.side_work()
        t = time.perf_counter()
        while not ev.query() and time.perf_counter() - t < 0.0008:  # inside the host allowance
            pass
        return a * 2.0

    timer.run(plain, [x] * 3, label="w1")
    timer.run(prefetch, [x] * 3, label="w2")
    p = sorted(timer.run(plain, [x] * 30, label="p")["ms_per_call"] for _ in range(5))[2]
    f = sorted(timer.run(prefetch, [x] * 30, label="f")["ms_per_call"] for _ in range(5))[2]
    print(f"plain {p * 1e3:.1f} us/call, with inputs read into L2 while held {f * 1e3:.1f} us/call")
    assert f >= 0.95 * p, (f, p)


@pytest.mark.gpu
@pytest.mark.parametrize("reported,gate_flush", [(False, False), (False, True), (True, True)])
def test_side_stream_work_is_not_timed_faster_than_the_same_work_on_the_held_stream(tmp_path, reported, gate_flush,
                                                                                   request):
    """Work on another stream is counted by the release-to-synchronised time less the gate latency (upper quartile
    + 5 us): unreported it can come out a few microseconds per call faster than on the held stream (open at the
    Timer's level: xfail; with the gate's L2 flush the latency, and so what is forgiven, includes the flush);
    reported by the harness (Timer.side_work: launches, CUDA graph replays and torch ops on another stream, as
    tests/integrity/test_integrity_gpu.py's side-stream attacks check) the call counts its whole wall clock."""
    if not reported:
        request.applymarker(pytest.mark.xfail(strict=False, reason="open (red-team review): the latency forgiven"))
    timer, torch = _timer(tmp_path, True, timing_gate_flush=gate_flush)
    side = torch.cuda.Stream()
    x = torch.randn(1 << 22, device="cuda")

    def work(a):
        y = a
        for _ in range(8):
            y = y * 1.0001
        return y

    def on_side(a):
        if reported:
            timer.side_work()
        with torch.cuda.stream(side):
            return work(a)

    timer.run(work, [x] * 3, label="w1")
    timer.run(on_side, [x] * 3, label="w2")
    c = sorted(timer.run(work, [x] * 50, label="cur")["ms_per_call"] for _ in range(5))[2]
    s = sorted(timer.run(on_side, [x] * 50, label="side")["ms_per_call"] for _ in range(5))[2]
    print(f"held stream {c * 1e3:.1f} us/call, side stream {s * 1e3:.1f} us/call, latency "
          f"{timer.gate_latency_ms * 1e3:.1f} us")
    assert s >= 0.99 * c, (s, c)


def test_gated_call_whose_harness_saw_side_stream_work_counts_its_whole_wall_clock(monkeypatch):
    """sandbox.candidate calls Timer.side_work() from inside a gated call that put work on another stream (kernels
    by stream handle, torch ops under another stream): copies there run while the gate holds the SMs, so the call
    counts its whole wall clock (host time included), as an expired one does, without a strike."""
    t, fake, gate = _fake_timer(monkeypatch, event_ms=0.001)

    def side(a):
        fake.clock[0] += 0.0005
        t.side_work()
        return a

    r = t.run(side, [1, 2], label="s")
    assert r["ms_per_call"] == pytest.approx(0.8) and r["gate_side"] == 2 and "s" not in t.ungated
    assert t.run(lambda a: a, [1, 2], label="c")["ms_per_call"] == pytest.approx(0.28)  # the flag is per call


def test_guard_counts_ops_dispatched_under_another_stream(monkeypatch):
    import torch

    from sandbox.guard import ComputeGuard

    cur = [_FakeStream(0)]
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: cur[0])
    x = torch.ones(4)
    with ComputeGuard(held=0) as g:
        torch.empty_like(x).copy_(x)
    assert g.side_ops == 0
    with ComputeGuard(held=0) as g:
        cur[0] = _FakeStream(9)
        torch.empty_like(x).copy_(x)
    assert g.side_ops == 2
    with ComputeGuard() as g:  # not gated: not looked at
        torch.empty_like(x)
    assert g.side_ops == 0


def test_launches_are_counted_by_stream_handle():
    """In a fresh process (an installed monitor refuses a count that no launch made, and this test process may
    hold one from an earlier test)."""
    import subprocess
    import sys

    code = ("from sandbox import runtime\n"
            "runtime._count('some_kernel', 12345); runtime._count('some_kernel', 12345); runtime._count('k', 7)\n"
            "print(runtime.launch_streams[12345], runtime.launch_streams[7], runtime.launch_counts['some_kernel'])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["2", "1", "2"]


def test_gate_latency_can_be_measured_again_and_its_identity_taken_again(monkeypatch):
    from sandbox.integrity import IdentitySnapshot

    t, fake, gate = _fake_timer(monkeypatch, sync_s=0.0, event_ms=0.0, lat=0.04)
    snap = IdentitySnapshot()
    snap.add_attrs(t, ["gate_latency_ms"], "Timer")
    assert t.calibrate_gate() == pytest.approx(0.005)  # fake: empty calls take no time; the 5 us margin
    assert snap.replaced() == ["Timer.gate_latency_ms"]
    snap.refresh("Timer.gate_latency_ms")
    assert snap.replaced() == []


def test_candidate_measures_the_gate_latency_again_at_its_first_calibrate():
    import inspect

    from sandbox.candidate import Worker

    src = inspect.getsource(Worker.calibrate)
    assert "self.timer.calibrate_gate()" in src and 'self.identities.refresh("Timer.gate_latency_ms")' in src
    assert src.index("if self.model is not None") < src.index("calibrate_gate")  # before load only


class _FakeLibcuda:
    """The driver calls Gate makes, on plain memory (ctypes arguments as the real ones take them)."""

    def __init__(self, occupancy: int = 2, slots: int = 2048):
        import ctypes

        self.host = (ctypes.c_uint32 * 16)()
        self.occupancy, self.slots = occupancy, slots
        self.launches: list = []
        self.current = 0

        def fn(name, body):
            f = lambda *a: body(*a) or 0  # noqa: E731
            setattr(self, name, f)

        attrs = {1: 1024, 16: 132, 39: slots}
        fn("cuCtxGetCurrent", lambda p: setattr(p._obj, "value", self.current or None))
        fn("cuCtxSetCurrent", lambda c: setattr(self, "current", c))
        fn("cuModuleLoadData", lambda p, img: setattr(p._obj, "value", 0x1000))
        fn("cuModuleGetFunction", lambda p, m, n: setattr(p._obj, "value", 0x2000))
        fn("cuMemHostAlloc", lambda p, n, f: setattr(p._obj, "value", ctypes.addressof(self.host)))
        fn("cuMemHostGetDevicePointer_v2", lambda p, h, f: setattr(p._obj, "value", h.value))
        fn("cuMemAlloc_v2", lambda p, n: setattr(p._obj, "value", 0x3000))
        fn("cuMemsetD32_v2", lambda a, v, n: None)
        fn("cuDeviceGet", lambda p, i: setattr(p._obj, "value", i))
        fn("cuDeviceGetAttribute", lambda p, a, d: setattr(p._obj, "value", attrs[a]))
        fn("cuOccupancyMaxActiveBlocksPerMultiprocessor", lambda p, f, t, s: setattr(p._obj, "value", self.occupancy))
        fn("cuLaunchKernel", lambda *a: self.launches.append(a))

    def __getitem__(self, name: str):  # CDLL's lib["symbol"]
        return getattr(self, name)


def _fake_gate(monkeypatch, lib):
    import ctypes

    from sandbox import runtime, timing_gate

    class Drv:
        def check(self, rc, what):
            if rc != 0:
                raise runtime.KernelLaunchError(what)

        def primary_context(self, device):
            lib.current = 0x77
            return 0x77

    monkeypatch.setattr(runtime, "_get_driver", lambda: Drv())
    monkeypatch.setattr(ctypes, "CDLL", lambda name: lib)
    return timing_gate.Gate(b"cubin", 20.0, 0)


def test_gate_setup_on_a_fake_driver_launches_random_values_and_reads_its_words(monkeypatch):
    lib = _FakeLibcuda()
    g = _fake_gate(monkeypatch, lib)
    assert (g.blocks, g.threads, g.device) == (264, 1024, 0)
    g.close(0)
    w1 = g._a_want.value
    assert len(lib.launches) == 1 and lib.launches[0][1] == 264 and lib.launches[0][4] == 1024
    assert lib.host[0] != w1 and not g.expired()
    g.open()
    assert lib.host[0] == w1  # the flag word
    g.close(0)
    assert g._a_want.value != w1
    lib.host[1] = g._a_want.value  # the gate wrote `expired`
    assert g.expired()
    assert len(g._params) == 7 and (g._a_flush.value, g._a_flush_vecs.value) == (0, 0)  # no flush asked for
    assert (g._params[5], g._params[6]) == (ctypes.addressof(g._a_flush), ctypes.addressof(g._a_flush_vecs))
    g.close(0, 0x40000, 1 << 20)
    assert (g._a_flush.value, g._a_flush_vecs.value) == (0x40000, (1 << 20) // 16)
    g.close(0)  # the next launch without one flushes nothing
    assert (g._a_flush.value, g._a_flush_vecs.value) == (0, 0)


def test_gate_puts_its_launch_parameters_back_before_every_launch(monkeypatch):
    """An item of the launch's parameter array re-pointed in place (the array object is the same, so the identity
    snapshot does not see it) at a word of the solution's own (a flush of one 16-byte vector, another flag word), or
    a fixed value changed in place (the timeout, the expiry word's address), is put back by the next close(): the
    launch reads the gate's own values (the review of session 26)."""
    lib = _FakeLibcuda()
    g = _fake_gate(monkeypatch, lib)
    own = (ctypes.c_uint64(1), ctypes.c_uint64(0))
    g._params[6] = ctypes.addressof(own[0])  # the flush's size in vectors
    g._params[0] = ctypes.addressof(own[1])  # the flag word the gate waits on
    fixed = (g._a_flag.value, g._a_timeout.value, g._a_expired.value, g._a_release.value)
    g._a_timeout.value, g._a_expired.value = 1 << 62, 0x9000  # values changed in place: the same ctypes objects
    g.close(0, 0x40000, 1 << 20)
    params = lib.launches[-1][9]
    assert tuple(params) == g._param_addrs
    assert ctypes.c_uint64.from_address(params[6]).value == (1 << 20) // 16
    assert params[0] == ctypes.addressof(g._a_flag)
    assert (g._a_flag.value, g._a_timeout.value, g._a_expired.value, g._a_release.value) == fixed


def test_gate_that_cannot_fill_an_sm_is_not_loaded(monkeypatch):
    from sandbox.runtime import KernelLaunchError

    with pytest.raises(KernelLaunchError, match="cannot fill an SM"):
        _fake_gate(monkeypatch, _FakeLibcuda(occupancy=1))
    g = _fake_gate(monkeypatch, _FakeLibcuda(occupancy=2, slots=1536))  # 2 blocks of 768 fill 1536 slots
    assert (g.blocks, g.threads) == (264, 768)


def test_gated_call_counts_in_full_when_the_python_stream_layer_disagrees_with_the_raw_stream(monkeypatch):
    """The Timer reads the current stream's handle through torch._C builtins bound before the import
    (timing.raw_stream_reader); torch.cuda.current_stream is Python a solution can make lie (rebinding
    torch._C._cuda_getCurrentStream). A call after which the raw stream is another one than the held, or before which
    the Python layer names another stream than the raw one, counts its whole wall clock."""
    t, fake, gate = _fake_timer(monkeypatch, event_ms=0.001)
    raw = [0]
    t.raw_stream = lambda: raw[0]

    def side_but_python_says_held(a):
        fake.clock[0] += 0.0005
        raw[0] = 9  # the real current stream moved; fake.current (the Python layer) still names the held one
        return a

    r = t.run(side_but_python_says_held, [1, 2], label="c")
    assert r["gate_side"] == 2 and r["gated"] == 0 and r["ms_per_call"] == pytest.approx(0.8)
    r = t.run(lambda a: a, [1, 2], label="d")  # the raw stream stays 9, the Python layer says 0: in full too
    assert r["gate_side"] == 2 and r["gated"] == 0
    raw[0] = 0
    r = t.run(lambda a: a, [1, 2], label="e")  # the two agree: gated as usual
    assert r["gated"] == 2 and r["gate_side"] == 0


def test_guard_reads_the_stream_through_the_function_it_was_given(monkeypatch):
    """Code run from ComputeGuard's dispatch runs with the guard off: the candidate worker hands it its timer's
    builtin reader, and the guard then never calls torch.cuda.current_stream (which a solution could rebind)."""
    import torch

    from sandbox.guard import ComputeGuard

    def rebound(device=None):
        raise AssertionError("the guard called torch.cuda.current_stream")

    monkeypatch.setattr(torch.cuda, "current_stream", rebound)
    x = torch.ones(4)
    with ComputeGuard(held=3, current=lambda: 3) as g:
        torch.empty_like(x).copy_(x)
    assert g.side_ops == 0
    with ComputeGuard(held=3, current=lambda: 4) as g:
        torch.empty_like(x).copy_(x)
    assert g.side_ops == 2
