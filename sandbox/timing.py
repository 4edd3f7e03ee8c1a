"""Timed repetitions, the same policy for the reference side and the candidate worker.

What is trusted, and why:
- The trusted worker's own clock (`time.perf_counter` in the trusted process) is the only clock the candidate
  cannot touch. The trusted side measures wall-clock time around every candidate repetition (one `time` request,
  which carries the repetition's input sets: the child synchronises the device and copies the outputs before it
  answers) and accepts the candidate's in-process figure only when it agrees with that wall clock
  (`agrees_with_estimate`). Otherwise the repetition is charged its whole shortfall against the trusted estimate.
  A figure above the raw wall clock is replaced by the wall clock. The disagreement is logged, and when gross it is
  reported as a violation.
- The round trip and the harness's own cost per timed call (unpacking, the checks and the output copies after
  each call) are measured before the solution is imported (`calibrate` requests, pings), never from requests the
  solution's process answers later (it could delay them at will and inflate what is subtracted). From them,
  `trusted_estimate` is the trusted side's own figure for a repetition; when the in-process figures fall short of
  it by more than SandboxConfig.timing_slack_ms + timing_slack_rel, a repetition is charged its shortfall beyond
  that slack (`charge_shortfall`, every repetition on its own): a candidate that under-reports gains at most the
  slack, in every repetition (the slack includes SandboxConfig.timing_slack_harness_rel, by default a quarter, of
  the calibrated harness cost of a repetition), plus the unpacking time it reports beyond its real cost, which
  trusted_estimate believes up to 3 x the trusted side's packing + 0.5 ms.
- In the candidate's process, device events have to be recorded in its own CUDA context, so a `Timer` is built
  there before the solution is imported: it captures the clock, the synchronisation and event functions it will
  use (the objects themselves, so a later monkeypatch of `torch.cuda.synchronize` or `time.perf_counter` does not
  reach it), and `Timer.tampered()` reports any of them, or this module's functions, that were replaced since, and
  the L2 flush buffer changed in place (its whole layout, type and instance attributes against construction's).
- Per call on CUDA: persisting-L2 lines are reset (`cuCtxResetPersistingL2Cache`, persisting set-aside limit 0:
  an access-policy window cannot keep data in L2 across calls), L2 is flushed (a write over a buffer larger than
  L2), the device is synchronised, the start event recorded, the call runs, the whole device is synchronised (work
  on side streams counts) and the end event recorded. The in-loop wall clock of each call is kept next to its
  event time: events that claim much less than the wall clock around them are not believed either.
- Gated (sandbox.timing_gate, SandboxConfig.timing_gate): before the start event, a kernel that fills every SM
  holds the stream until the call has been enqueued, so the events bracket the GPU's run of the call and not the host's
  Python and launch overhead (the noise of a shared host). What the host does inside the call is still bounded:
  a gated call counts for at least its host time less `host_allowance_ms`, and for at least the host's
  release-to-synchronised time less the gate's measured latency (side-stream work that outlasts the end event);
  both events are recorded on the held stream, and a call that leaves another stream current (put back) or that
  the harness saw put work on another stream (`side_work`: kernels launched, CUDA graphs replayed, torch ops
  dispatched there) counts its whole wall clock, as an expired one does: the gate holds the SMs, not the copy
  engines (a copy on another stream runs while the host enqueues, off the clock), and the latency forgiven would be
  side-stream work. Gated with
  SandboxConfig.timing_gate_flush, L2 is flushed by the gate itself after its release (its blocks zero the flush
  buffer before the start event), not before the call: what a copy engine read into L2 while the gate held the
  stream is evicted, and the flush's time is part of the gate's latency. The gate is used only on its own device
  (torch's current device); elsewhere the run is ungated.
  The same Timer policy times eager, torch.compile and the candidate, so the three are measured alike.
- CPU: `perf_counter` around each call; the trusted side's wall clock bounds it the same way.
"""

from __future__ import annotations

import ctypes
import math
import time
from typing import Any, Callable, NamedTuple, Sequence

import torch

_PERF = time.perf_counter


def time_calls(fn: Callable[..., Any], args: tuple, calls: int, cuda: bool,
               flush: torch.Tensor | None = None) -> float:
    """ms per call of `fn(*args)` over `calls` calls (trusted-side helper for the baselines' calibration)."""
    t = Timer(cuda, flush)
    return t.run(lambda a: fn(*a), [args] * calls)["ms_per_call"]


def raw_stream_reader() -> Callable[[], int]:
    """A function that returns torch's current CUDA stream on the current device as a CUstream handle (int), read
    through the builtins torch._C._cuda_getCurrentRawStream and torch._C._cuda_getDevice as they are now: no Python
    code runs in a read, so a solution that later rebinds torch.cuda.current_stream, torch._C._cuda_getCurrentStream
    or their helpers does not change what it returns (the harness reads the stream where a solution's code could
    otherwise run: inside the dispatch guard, while the monitor is busy, around a gated call). On a build of torch
    without those builtins (CPU builds), torch.cuda.current_stream().cuda_stream, looked up at each call."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    dev = getattr(torch._C, "_cuda_getDevice", None)
    if raw is None or dev is None:
        return lambda: torch.cuda.current_stream().cuda_stream
    return lambda: raw(dev())


def l2_flush_buffer(nbytes: int, device: str) -> torch.Tensor | None:
    """A buffer whose zeroing evicts the L2 cache (None when nbytes is 0 or the device is the CPU)."""
    if nbytes <= 0 or not device.startswith("cuda"):
        return None
    return torch.empty(nbytes // 4, dtype=torch.int32, device=device)


class PersistingL2:
    """Resets persisting L2 lines and the persisting set-aside of the current context (driver API, ctypes).
    A no-op where libcuda or the calls are missing (CPU hosts, old drivers): `available` says which.

    The set-aside limit is read first (cuCtxGetLimit) and set to 0 only when it is not 0 already: on the H200,
    cuCtxSetLimit took 0.036 ms a call before a solution's import and 0.080 ms after its kernels had run, a
    difference the calibration did not see and the shortfall rule charged to the solution (benchmarks/RESULTS.md,
    session 12). A limit the solution set (the extension format can) is still put back to 0 before every call, and
    the persisting lines are reset before every call whatever the limit was."""

    CU_LIMIT_PERSISTING_L2_CACHE_SIZE = 0x06

    def __init__(self) -> None:
        self.available = False
        self._value = ctypes.c_size_t(0)
        try:
            lib = ctypes.CDLL("libcuda.so.1")
            self._reset = lib.cuCtxResetPersistingL2Cache
            self._limit = lib.cuCtxSetLimit
            self._limit.argtypes = [ctypes.c_int, ctypes.c_size_t]
            self._get = lib.cuCtxGetLimit
            self._get.argtypes = [ctypes.POINTER(ctypes.c_size_t), ctypes.c_int]
            self._ref = ctypes.byref(self._value)
            self.available = True
        except (OSError, AttributeError):
            pass

    def reset(self, parts: dict[str, float] | None = None, perf: Callable[[], float] | None = None) -> None:
        """Set-aside limit 0 (when it is not already), then the persisting lines reset. parts and perf (both or
        neither; the caller's own clock, bound before any solution code): the two steps' seconds added under
        l2_limit and l2_reset (Timer.run's between-calls parts, a diagnostic)."""
        if not self.available:
            return
        timed = parts is not None and perf is not None
        t0 = perf() if timed else 0.0
        # a failed query (non-zero CUresult) or a limit above 0: set to 0, as before the query existed
        if self._get(self._ref, self.CU_LIMIT_PERSISTING_L2_CACHE_SIZE) != 0 or self._value.value != 0:
            self._limit(self.CU_LIMIT_PERSISTING_L2_CACHE_SIZE, 0)
        t1 = perf() if timed else 0.0
        self._reset()
        if timed:
            t2 = perf()
            parts["l2_limit"] = parts.get("l2_limit", 0.0) + (t1 - t0)
            parts["l2_reset"] = parts.get("l2_reset", 0.0) + (t2 - t1)


class Timer:
    """Times calls with fresh arguments per call. Build it before any untrusted code runs (see module doc)."""

    def __init__(self, cuda: bool, flush: torch.Tensor | None = None, gate: Any = None,
                 host_allowance_ms: float = 0.0, gate_flush: bool = False):
        """cuda: time with CUDA events (else perf_counter); flush: the L2 flush buffer (l2_flush_buffer); gate: a
        sandbox.timing_gate.Gate of this process, or None (ungated: the events include the host's time to enqueue
        the call); host_allowance_ms: gated calls only, how much of the host's time to enqueue a call is not
        counted (see `run`); gate_flush: gated calls have the gate flush L2 after its release instead of a flush
        before the call (SandboxConfig.timing_gate_flush)."""
        self.cuda = cuda
        self.flush = flush
        # the flush buffer's whole layout, taken now, before any solution code: tampered() reports a buffer changed
        # in place (`set_`, `resize_`, `as_strided_`, a stride of 0, `.data =`, another class, an instance attribute
        # shadowing `zero_`: the same object, a smaller flush). The check comes after the request (a flush weakened
        # for a request's calls makes its result forbidden), not before each call. The storage object is kept, so
        # a tensor re-pointed elsewhere does not free the memory the gate zeroes (a storage resized in place does)
        self._flush_at: _FlushLayout | tuple[()] = ()
        self._flush_keep = None
        if flush is not None:
            self._flush_at = _flush_layout(flush)
            self._flush_keep = flush.untyped_storage()
        # gated with a flush buffer: the gate flushes L2 after its release (sandbox.timing_gate), in place of the
        # flush before the call; its address and size
        self._gate_flush: tuple[int, ...] = ()
        if cuda and gate is not None and flush is not None and gate_flush:
            lay = self._flush_at
            self._gate_flush = (lay.data_ptr, lay.element_size * math.prod(lay.size))
        self.gate = gate if cuda else None
        self.raw_stream: Callable[[], int] | None = None  # gated: the current stream's handle (raw_stream_reader)
        self.host_allowance_ms = float(host_allowance_ms)
        self.ungated: set[str] = set()  # labels whose gate expired twice: timed without it from then on
        self._side = False  # set by side_work() during a gated call
        self._expiries: dict[str, int] = {}
        self.gate_latency_ms = 0.0
        self._perf = _PERF
        self._refs: dict[str, Any] = {"time.perf_counter": time.perf_counter, "timing.Timer.run": Timer.run,
                                      "timing.Timer.tampered": Timer.tampered}
        if cuda:
            self._sync = torch.cuda.synchronize
            self._event = torch.cuda.Event
            self._record = torch.cuda.Event.record
            self._elapsed = torch.cuda.Event.elapsed_time
            self._l2 = PersistingL2()
            self._refs.update({"torch.cuda.synchronize": torch.cuda.synchronize, "torch.cuda.Event": torch.cuda.Event,
                               "torch.cuda.Event.record": torch.cuda.Event.record,
                               "torch.cuda.Event.elapsed_time": torch.cuda.Event.elapsed_time,
                               "torch.cuda.Event.synchronize": torch.cuda.Event.synchronize})
        self._codes = {k: getattr(v, "__code__", None) for k, v in self._refs.items()}
        if self.gate is not None:
            self._stream = torch.cuda.current_stream
            self._set_stream = torch.cuda.set_stream
            self.raw_stream = raw_stream_reader()  # the stream as a handle, through builtins (raw_stream_reader)
            for k, v in (("torch.cuda.current_stream", torch.cuda.current_stream),
                         ("torch.cuda.set_stream", torch.cuda.set_stream)):
                self._refs[k] = v
                self._codes[k] = getattr(v, "__code__", None)
            self.calibrate_gate()

    def calibrate_gate(self) -> float:
        """Measure the gate latency again (gate_latency_ms; the harness calls it while nothing else uses the GPU: a
        Timer built while another process's work shares the device measures that work's time slices too, and a
        latency too large forgives side-stream work). Returns it; 0.0 without a gate."""
        if self.gate is not None and self._on_gate_device():
            self.gate_latency_ms = self._gate_latency()
        return self.gate_latency_ms

    def _gate_latency(self, n: int = 9) -> float:
        """The host's view of an empty gated call (release to synchronised, less the events' interval), upper
        quartile of n, plus 5 us: what `run` allows a gated call's host-side figure over its events. It includes
        the gate's L2 flush after the release, when it flushes. At most 50 us (reference_worker._event_floor's
        bound when the gate does not flush) plus twice the flush's own time (events around a plain flush, median
        of 3): a latency measured beside other work would forgive side-stream work. Open: the flush's time is
        measured at the same moment as the latency it bounds, so other work on the GPU inflates both."""
        sync, rec, ela, gate = self._sync, self._record, self._elapsed, self.gate
        cap = 0.05
        if self._gate_flush and self.flush is not None:
            flush_ms = []
            for _ in range(3):
                s = self._event(enable_timing=True)
                e = self._event(enable_timing=True)
                rec(s)
                self.flush.zero_()
                rec(e)
                sync()
                flush_ms.append(ela(s, e))
            cap += 2.0 * sorted(flush_ms)[1]
        extra = []
        for _ in range(n):
            sync()
            s = self._event(enable_timing=True)
            e = self._event(enable_timing=True)
            gate.close(self._stream().cuda_stream, *self._gate_flush)
            rec(s)
            rec(e)
            t1 = self._perf()
            gate.open()
            sync()
            extra.append((self._perf() - t1) * 1e3 - ela(s, e))
        extra.sort()
        return min(max(extra[(3 * n) // 4], 0.0) + 0.005, cap)

    def _current(self) -> dict[str, Any]:
        cur = {"time.perf_counter": time.perf_counter, "timing.Timer.run": Timer.run,
               "timing.Timer.tampered": Timer.tampered}
        if self.cuda:
            cur.update({"torch.cuda.synchronize": torch.cuda.synchronize, "torch.cuda.Event": torch.cuda.Event,
                        "torch.cuda.Event.record": torch.cuda.Event.record,
                        "torch.cuda.Event.elapsed_time": torch.cuda.Event.elapsed_time,
                        "torch.cuda.Event.synchronize": torch.cuda.Event.synchronize})
            if self.gate is not None:
                cur["torch.cuda.current_stream"] = torch.cuda.current_stream
                cur["torch.cuda.set_stream"] = torch.cuda.set_stream
        return cur

    def tampered(self) -> list[str]:
        """Names of the timing functions that were replaced (or whose code was swapped) since construction, and
        "timing.Timer.flush" when the L2 flush buffer's layout (_flush_layout) is not the one it was built with, it
        has instance attributes, or it cannot be read."""
        out = []
        for k, v in self._current().items():
            if v is not self._refs[k] or getattr(v, "__code__", None) is not self._codes[k]:
                out.append(k)
        if self._flush_at:
            try:
                f = self.flush
                changed = f is None or bool(vars(f)) or _flush_layout(f) != self._flush_at
            except Exception:  # noqa: BLE001 - a buffer the check cannot read counts as changed
                changed = True
            if changed:
                out.append("timing.Timer.flush")
        return out

    def run(self, fn: Callable[[Any], Any], args_per_call: Sequence[Any], after: Callable[[Any], None] | None = None,
            label: str = "") -> dict[str, Any]:
        """Call fn(args_per_call[k]) for each k, timed. `after(out)` runs untimed after each call.

        Gated (CUDA with a gate, `label` not in `ungated`): per call, the gate holds the stream while fn enqueues
        its work; the call's figure is the largest of (a) its events' interval (the GPU's run of the call; both
        events on the held stream), (b) the host's release-to-synchronised time less `gate_latency_ms` (work on
        other streams that outlasts the end event counts), (c) the host's time inside fn less `host_allowance_ms`
        (host work hidden behind the gate counts beyond the allowance). A call that left another stream current (put
        back) or reported side_work() counts its whole wall clock (`gate_side`). A call whose gate expired (fn
        synchronised while held, took longer than the gate's timeout, or loaded a kernel lazily: CUDA's lazy loading
        waits for the device) counts its whole wall clock; a label whose gate expired twice is timed ungated from
        then on.

        Returns {ms_per_call, loop_ms (in-process wall clock over the timed regions), event_ms (CUDA: sum of the
        per-call figures; CPU: same as loop_ms), calls, gated (calls timed behind the gate), gate_expired, gate_side,
        host_ms (gated: the median of the host's time inside fn per call; else 0), between_ms (CUDA: where the time
        outside the timed regions went, ms summed over the calls; a diagnostic, see below)}.
        Exceptions from fn propagate.
        """
        perf = self._perf
        calls = len(args_per_call)
        loop = 0.0
        if not self.cuda:
            for a in args_per_call:
                t0 = perf()
                out = fn(a)
                loop += perf() - t0
                if after is not None:
                    after(out)
            return _result(loop * 1e3, loop * 1e3, calls)
        sync, rec, ela = self._sync, self._record, self._elapsed
        if self.gate is not None and label not in self.ungated and self._on_gate_device():
            return self._run_gated(fn, args_per_call, after, label)
        pairs = []
        # where the run's time outside its timed regions went (seconds summed over its calls here, ms in the
        # record's between_ms; a diagnostic): l2_limit and l2_reset (PersistingL2.reset), flush (the L2 flush enqueued and the
        # device synchronised), setup (events made; gated: the gate closed), after (the caller's `after`). A local
        # plain dict, never an attribute: nothing the solution could swap runs between t0 and the start event
        b: dict[str, float] = {"setup": 0.0, "after": 0.0}
        for a in args_per_call:
            self._before_call(b)
            ts = perf()
            s = self._event(enable_timing=True)
            e = self._event(enable_timing=True)
            b["setup"] += perf() - ts
            t0 = perf()
            rec(s)
            out = fn(a)
            sync()
            rec(e)
            loop += perf() - t0
            pairs.append((s, e))
            if after is not None:
                ta = perf()
                after(out)
                b["after"] += perf() - ta
        sync()
        return _result(sum(ela(s, e) for s, e in pairs), loop * 1e3, calls, between_ms=_ms_parts(b))

    def _before_call(self, parts: dict[str, float], flush: bool = True) -> None:
        """CUDA, before each timed call: persisting L2 lines reset, L2 flushed (unless flush is False: the gate
        flushes after its release), the device synchronised. parts: the run's local record of where its time went
        (seconds under l2_limit, l2_reset and flush; run's between_ms)."""
        self._l2.reset(parts, self._perf)
        t1 = self._perf()
        if self.flush is not None and flush:
            self.flush.zero_()
        self._sync()
        parts["flush"] = parts.get("flush", 0.0) + (self._perf() - t1)

    def side_work(self) -> None:
        """Called by the harness from inside a gated call (fn) that put work on a stream other than the held one
        (sandbox.candidate: the solution's launches by stream, torch ops dispatched under another stream): that call
        counts its whole wall clock, host time included, as an expired one does. The gate holds the SMs, not the
        copy engines (a copy on another stream runs while the host enqueues), and the events bracket the held
        stream only (what the latency forgives of the release-to-synchronised time would be side-stream work)."""
        self._side = True

    def _on_gate_device(self) -> bool:
        """Whether torch's current device is the gate's (the events, the synchronisation and the stream are the
        current device's; a gate of another device would hold nothing the call uses): else the run is ungated."""
        return self._stream().device_index == getattr(self.gate, "device", 0)

    def _run_gated(self, fn: Callable[[Any], Any], args_per_call: Sequence[Any],
                   after: Callable[[Any], None] | None, label: str) -> dict[str, Any]:
        """`run` on CUDA behind the gate (see run's doc)."""
        perf, sync, rec, ela, gate = self._perf, self._sync, self._record, self._elapsed, self.gate
        stream, set_stream, raw = self._stream, self._set_stream, self.raw_stream
        lat, allow, gflush = self.gate_latency_ms, self.host_allowance_ms, self._gate_flush
        loop = 0.0
        total = 0.0
        gated = expired = side = 0
        hosts: list[float] = []
        b: dict[str, float] = {"setup": 0.0, "after": 0.0}  # as in run: a local plain dict
        rest_parts: dict[str, float] = {}
        for k, a in enumerate(args_per_call):
            if label in self.ungated:  # the gate expired earlier in this run: the rest ungated
                rest = self.run(fn, args_per_call[k:], after, label)
                loop += rest["loop_ms"] / 1e3
                total += rest["event_ms"]
                rest_parts = rest["between_ms"]
                break
            self._before_call(b, flush=not gflush)
            ts = perf()
            s = self._event(enable_timing=True)
            e = self._event(enable_timing=True)
            held = stream()
            handle = held.cuda_stream
            # the stream torch really has current: a Python layer that says otherwise (a solution's rebinding of
            # torch.cuda's helpers) makes the call count in full
            lied = raw() != handle
            gate.close(handle, *gflush)  # with gflush, L2 is flushed after the release, before the start event
            rec(s, held)
            b["setup"] += perf() - ts
            t0 = perf()
            moved = self._side = False
            try:
                out = fn(a)
                rec(e, held)  # on the held stream, whichever stream fn left current
            finally:
                t1 = perf()
                gate.open()  # whatever fn did, the stream is not left held
                if raw() != handle or lied:  # fn left another stream current: put back, and counted in full
                    set_stream(held)
                    moved = True
            moved = moved or self._side
            sync()
            t2 = perf()
            loop += t2 - t0
            hosts.append((t1 - t0) * 1e3)
            if gate.expired():
                expired += 1
                self._expiries[label] = self._expiries.get(label, 0) + 1
                if self._expiries[label] >= 2:
                    self.ungated.add(label)
                total += (t2 - t0) * 1e3
            elif moved:  # work on another stream, or another stream left current: the whole wall clock
                side += 1
                total += (t2 - t0) * 1e3
            else:
                gated += 1
                total += gated_figure(ela(s, e), (t2 - t1) * 1e3, (t1 - t0) * 1e3, lat, allow)
            if after is not None:
                ta = perf()
                after(out)
                b["after"] += perf() - ta
        hosts.sort()
        parts = _ms_parts(b)
        for key, v in rest_parts.items():  # the ungated rest's parts (already ms)
            parts[key] = parts.get(key, 0.0) + v
        return _result(total, loop * 1e3, len(args_per_call), gated, expired, side,
                       hosts[len(hosts) // 2] if hosts else 0.0, parts)


class _FlushLayout(NamedTuple):
    """A tensor's layout as Timer.tampered compares it (_flush_layout)."""
    type: type
    data_ptr: int
    element_size: int
    size: tuple[int, ...]
    stride: tuple[int, ...]
    storage_offset: int
    storage_ptr: int
    storage_nbytes: int


def _flush_layout(t: torch.Tensor) -> _FlushLayout:
    """A tensor's layout, read through torch._C.TensorBase's own methods (an instance attribute cannot shadow them).
    Raises TypeError for anything that is not a tensor."""
    tb = torch._C.TensorBase
    st = tb.untyped_storage(t)
    return _FlushLayout(type(t), tb.data_ptr(t), tb.element_size(t), tuple(tb.size(t)), tuple(tb.stride(t)),
                        tb.storage_offset(t), st.data_ptr(), st.nbytes())


def _ms_parts(parts: dict[str, float]) -> dict[str, float]:
    """A run's between-calls parts, kept in seconds while it runs, in ms."""
    return {k: v * 1e3 for k, v in parts.items()}


def _result(event_ms: float, loop_ms: float, calls: int, gated: int = 0, expired: int = 0, side: int = 0,
            host_ms: float = 0.0, between_ms: dict[str, float] | None = None) -> dict[str, Any]:
    """Timer.run's record (see its doc)."""
    return {"ms_per_call": event_ms / max(calls, 1), "loop_ms": loop_ms, "event_ms": event_ms, "calls": calls,
            "gated": gated, "gate_expired": expired, "gate_side": side, "host_ms": host_ms,
            "between_ms": dict(between_ms or {})}


def gated_figure(event_ms: float, release_to_sync_ms: float, host_ms: float, latency_ms: float,
                 allowance_ms: float) -> float:
    """One gated call's time (ms): the largest of its events' interval, the host's release-to-synchronised time less
    the gate's latency, and the host's time inside the call less the allowance (Timer.run)."""
    return max(event_ms, release_to_sync_ms - latency_ms, host_ms - allowance_ms)


def trusted_estimate(wall_ms: float, rtt_ms: float, overhead_ms: float, calls: int, prep_ms: Any,
                     trusted_prep_ms: float, fixed_ms: float = 0.0) -> float:
    """The trusted side's own figure (ms) for one repetition of `calls` timed calls: its wall clock around the time
    request, less the round trip, the harness's fixed cost per request (fixed_ms) and `calls` times its per-call
    cost (overhead_ms; all three measured before the solution was imported, reference_worker._calibrate), less the
    candidate harness's report of unpacking the request's inputs (prep_ms), which counts for at most 3x what packing
    them took on the trusted side (trusted_prep_ms) plus 0.5 ms."""
    try:
        prep = float(prep_ms)
    except (TypeError, ValueError):
        prep = 0.0
    if not (prep >= 0.0 and prep < float("inf")):
        prep = 0.0
    prep = min(prep, 3.0 * max(trusted_prep_ms, 0.0) + 0.5)
    return max(wall_ms - rtt_ms - max(fixed_ms, 0.0) - prep - calls * overhead_ms, 0.0)


def agree(in_process_ms: float, wall_ms: float, rtt_ms: float) -> bool:
    """Whether an in-process figure for one repetition agrees with the trusted wall clock around it.

    It must not exceed the wall clock (plus 0.5 ms of clock granularity), and must cover at least half of the wall
    clock less four round trips of an empty request, less 1 ms. The band is wide on purpose: on a shared CPU host
    a request can wait for a core for milliseconds (a false alarm would cost an honest solution its reward), and
    a candidate that under-reports gains at most 2x before its figure is replaced by the wall clock's.
    """
    if in_process_ms > wall_ms + 0.5:
        return False
    return in_process_ms >= 0.5 * (wall_ms - 4.0 * rtt_ms) - 1.0


def agrees_with_estimate(in_process_ms: float, wall_ms: float, estimate_ms: float, rtt_ms: float) -> bool:
    """`agree` around the trusted estimate (trusted_estimate): the in-process figure may not exceed the raw wall
    clock (plus 0.5 ms), and must cover at least half of the estimate less three round trips, less 1 ms."""
    if in_process_ms > wall_ms + 0.5:
        return False
    return in_process_ms >= 0.5 * (estimate_ms - 3.0 * rtt_ms) - 1.0


def charge_shortfall(samples_ms: list[float], estimates_ms: list[float], in_process_ms: list[float], calls: int,
                      slack_ms: float, slack_rel: float,
                      charged: Sequence[bool] | None = None,
                      harness_ms: float = 0.0) -> tuple[list[float], float, float]:
    """The shortfall rule (module doc). samples_ms: the candidate's per-call times, one per repetition;
    estimates_ms / in_process_ms: trusted_estimate and the in-process wall clock of each repetition (ms for `calls`
    calls). Returns (per-call times to use, median shortfall in ms, the slack in ms).

    Each repetition is charged what its own shortfall exceeds the slack (slack_ms + slack_rel * the median
    estimate + harness_ms, the harness-proportional part: SandboxConfig.timing_slack_harness_rel x the calibrated
    harness cost of a repetition) by: sample + max(0, estimate - in_process - slack) / calls. charged: per
    repetition, whether its sample already carries its whole shortfall (a disagreement, reference_worker's profile); such a repetition is
    not charged twice. The median shortfall is returned for the log.

    Every repetition, not only when the median one falls short: a rule gated on the median repetition let a liar
    hide its work in just under half of the repetitions, uncharged (9 of 20: the median shortfall stays an honest
    one's), and np.median of 20 samples then averages the 10th and 11th smallest, two of the honest ones' lowest,
    which moved the speed-up's point and lower bound by about 1.5 standard deviations of the honest noise (a 5% top
    margin is of that order). An honest repetition the host stole time from outside the in-process clock is charged
    that time too, as the trusted wall clock saw it: that one sample moves to the top of the distribution, which
    moves the median by one rank at most.

    The rule adds the shortfall; it does not floor a sample at the wall clock. That matters when the sample is far
    below the in-process wall clock. A gated CUDA figure is such a sample: it leaves out the host's time to enqueue
    and synchronise each call, a few hundred microseconds, and a kernel may run for tens. Flooring it at
    (estimate - slack) / calls would charge an honest solution that host time whenever noise pushed the median
    shortfall past the slack, 10-25x its figure. An ungated sample is about in_process / calls, so both rules give
    about (estimate - slack) / calls. Either way, work hidden outside the in-process clock is charged in full less
    the slack, so a liar gains at most the slack."""
    short = sorted(e - f for e, f in zip(estimates_ms, in_process_ms))
    med = short[len(short) // 2] if short else 0.0
    ests = sorted(estimates_ms)
    limit = slack_ms + slack_rel * (ests[len(ests) // 2] if ests else 0.0) + max(harness_ms, 0.0)
    n = max(calls, 1)
    done = list(charged) if charged is not None else [False] * len(samples_ms)
    return [ms if c else ms + max(0.0, e - f - limit) / n
            for ms, e, f, c in zip(samples_ms, estimates_ms, in_process_ms, done)], med, limit
