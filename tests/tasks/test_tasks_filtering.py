"""Execution-based filtering: every rejection reason on a task built to trigger it, and the worker pool."""

import textwrap

import pytest

from tasks.filtering import FilterConfig, FilterPool, check_task, filter_in_process
from tasks.schema import Task

BASE = '''
import torch
import torch.nn as nn

batch_size = 64
dim = 256


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x{extra_arg}):
{body}


def get_inputs():
    return [torch.randn(batch_size, dim){extra_input}]


def get_init_inputs():
    return []
'''


def make(body: str, two_inputs: bool = False, task_id: str = "t", **kw) -> Task:
    src = BASE.format(body=textwrap.indent(textwrap.dedent(body).strip(), " " * 8),
                      extra_arg=", y" if two_inputs else "",
                      extra_input=", torch.randn(batch_size, dim)" if two_inputs else "")
    return Task(id=task_id, name=task_id, reference=src, shape_params={"batch_size": 64, "dim": 256}, **kw)


FAST = dict(check_compile=False, check_timing=False)


@pytest.mark.parametrize("body, reason, two", [
    ("return torch.log(x - 100)", "nonfinite_output", False),
    ("return x * 0", "zero_output", False),
    ("return torch.full_like(x, 2.0)", "constant_output", False),
    ("return torch.where(x > 3.6, x, torch.zeros_like(x))", "near_constant_output", False),
    ("return x * 1e-9", "vanishing_output", False),
    ("return x * 1e9", "exploding_output", False),
    ("return torch.relu(x) * 2", "input_unused", True),
    ("return torch.clamp(x * 1000.0, -1.0, 1.0)", "input_unused", False),  # saturated: x barely matters
    ("return x + torch.clamp(x, -1.0, 1.0) * 0.0", "dead_op", False),
    ("return x @ x + 1", "forward_error", False),
    ("return [x.sum(), 3]", "non_tensor_output", False),
])
def test_rejection_reasons(body, reason, two):
    v = check_task(make(body, two), FilterConfig(**FAST))
    assert not v.accepted and v.reason == reason, (v.reason, v.detail)
    assert v.detail or reason in ("zero_output",)


def test_accepts_a_live_task_and_reports_its_signature():
    v = check_task(make("y = torch.tanh(x) * 2\nreturn torch.softmax(y, dim=-1)"), FilterConfig(**FAST))
    assert v.accepted, v.detail
    assert v.signature == ["tanh", "mul", "softmax"] and v.output_shapes == [[64, 256]]


def test_not_deterministic():
    t = make("return x + len(_calls) if _calls.append(1) is None else x")
    t = t.replace(reference=t.reference.replace("batch_size = 64", "_calls = []\nbatch_size = 64"))
    v = check_task(t, FilterConfig(**FAST))
    assert v.reason == "not_deterministic"


def test_no_effect_operator_uses_recorded_op_lines():
    t = make("x = torch.abs(x)\nx = torch.relu(x)\nreturn x")
    lines = t.reference.splitlines()
    spans = [[i + 1, i + 1] for i, line in enumerate(lines) if line.strip().startswith("x = torch.")]
    meta = {"op_lines": spans, "op_preserves_shape": [True, True]}
    v = check_task(t.replace(operators=("abs", "relu"), metadata=meta), FilterConfig(**FAST))
    assert v.reason == "no_effect_op" and "relu" in v.detail


def test_time_window_and_autosize():
    t = make("return torch.sigmoid(x) * x")
    slow_cfg = FilterConfig(check_compile=False, eager_window_ms=[1e-6, 1e-5], min_reps=2, max_reps=3)
    v = check_task(t, slow_cfg)
    assert v.reason == "too_slow" and v.eager_ms > 1e-5
    fast_cfg = FilterConfig(check_compile=False, eager_window_ms=[500.0, 1000.0], min_reps=2, max_reps=3)
    assert check_task(t, fast_cfg).reason == "too_fast"
    # autosize doubles the shape parameters toward the window; a modest window is reachable.
    # a wide window: timings on two shared cores can be several times off; the point is that it grows
    auto = FilterConfig(check_compile=False, eager_window_ms=[0.2, 500.0], min_reps=3, max_reps=5, autosize=True)
    tiny = t.replace(reference=t.reference.replace("batch_size = 64", "batch_size = 2"),
                     shape_params={"batch_size": 2, "dim": 256})
    v = check_task(tiny, auto)
    assert v.accepted, v.detail
    assert v.resized_params["batch_size"] > 2 and 0.2 <= v.eager_ms <= 500.0
    assert check_task(tiny, FilterConfig(check_compile=False, eager_window_ms=[0.2, 500.0])).reason == "too_fast"


@pytest.mark.slow
def test_compile_check_accepts_and_catches_mismatch():
    """One in-process torch.compile round (the first compile in a process costs 15-25 s here)."""
    good = make("return torch.relu(x) + x.mean(dim=-1, keepdim=True)", task_id="good")
    bad = make("if torch.compiler.is_compiling():\n    return torch.relu(x) + 1\nreturn torch.relu(x)",
               task_id="bad")
    cfg = FilterConfig(eager_window_ms=[0.0, 1000.0], min_reps=2, max_reps=3)
    (g, vg), (b, vb) = filter_in_process([good, bad], cfg)
    assert vg.accepted and vg.compile_ms is not None and vg.eager_ms is not None, vg.detail
    assert vb.reason == "compile_mismatch" and "max abs difference 1" in vb.detail


@pytest.mark.slow
def test_pool_survives_hangs_and_crashes():
    # the per-task limit has room for a first check in a fresh worker on two busy cores
    cfg = FilterConfig(check_compile=False, check_timing=False, workers=2, task_timeout_s=15.0, warm_compile=False)
    hang = make("while True:\n    pass", task_id="hang")
    crash = make("import ctypes\nctypes.string_at(0)\nreturn x", task_id="crash")
    good = [make("return torch.tanh(x) * 3", task_id=f"good{i}") for i in range(3)]
    with FilterPool(cfg) as pool:
        got = {t.id: v for t, v in pool.map([hang, crash] + good)}
    assert got["hang"].reason == "timeout"
    assert got["crash"].reason == "worker_crash" and "code" in got["crash"].detail
    assert all(got[f"good{i}"].accepted for i in range(3))


def test_config_validation():
    with pytest.raises(ValueError, match="device must be one of"):
        FilterConfig(device="tpu")
    with pytest.raises(ValueError, match="eager_window_ms"):
        FilterConfig(eager_window_ms=[5.0, 1.0])
    assert FilterConfig(device="cuda").window == (1.0, 100.0)


def test_pool_gives_up_when_workers_cannot_start(monkeypatch):
    """A worker that dies before it is ready (a broken environment) ends the run with an error, not a loop."""
    monkeypatch.setattr("tasks.filtering._worker_main", _die_at_start)
    cfg = FilterConfig(check_compile=False, check_timing=False, workers=1, warm_compile=False)
    with pytest.raises(RuntimeError, match="die while starting"):
        with FilterPool(cfg, max_start_failures=2) as pool:
            list(pool.map([make("return torch.tanh(x) * 3")]))


def _die_at_start(conn, cfg_dict, slot=0):
    raise SystemExit(3)


def test_out_of_memory_is_the_tasks_fault_on_the_cpu_and_classified_through_wrappers():
    """On the CPU backend a torch.OutOfMemoryError can only come from the task's own code: forward_error, no retry.
    On a GPU (tested in test_device_out_of_memory_is_checked_again_on_the_gpu) an OOM is recognised also as the
    cause of another error (torch.compile's BackendCompilerFailed), and an exception whose message cannot be read
    is still described."""
    import time

    import torch

    from tasks.filtering import _describe, _is_oom

    t0 = time.monotonic()
    v = check_task(make('raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")'),
                   FilterConfig(**FAST))
    assert v.reason == "forward_error" and v.oom_retries == 0 and time.monotonic() - t0 < 10, (v.reason, v.detail)
    v = check_task(make('raise RuntimeError("out of memory")'), FilterConfig(**FAST))
    assert v.reason == "forward_error" and v.oom_retries == 0, (v.reason, v.detail)

    from torch._dynamo.exc import BackendCompilerFailed

    oom = torch.OutOfMemoryError("CUDA out of memory")
    try:
        wrapped = BackendCompilerFailed(lambda *a: None, oom)
    except TypeError:  # the constructor's signature differs between torch versions
        wrapped = RuntimeError("backend compiler failed")
        wrapped.inner_exception = oom
    assert _is_oom(oom) and _is_oom(wrapped) and not _is_oom(RuntimeError("CUDA error: out of memory"))
    if hasattr(torch, "AcceleratorError"):  # a CUDA call's own out-of-memory error (a library workspace)
        assert _is_oom(torch.AcceleratorError("CUDA error: out of memory"))
        assert not _is_oom(torch.AcceleratorError("CUDA error: an illegal memory access was encountered"))
    try:
        try:
            raise oom
        except torch.OutOfMemoryError as e:
            raise ValueError("while handling") from e
    except ValueError as chained:
        assert _is_oom(chained)

    class Unreadable(Exception):
        def __str__(self):
            raise ValueError("no str")

    assert _describe(Unreadable(), with_traceback=True).startswith("Unreadable: (its message could not be read)")


@pytest.mark.gpu
def test_device_out_of_memory_is_checked_again_on_the_gpu():
    """On a GPU a torch.OutOfMemoryError (the memory taken by other workers on the GPU) is not a verdict on the task:
    the check runs again (here the reference raises it on its first run only: accepted on the retry), and one that
    keeps running out of memory ends as out_of_memory after oom_retries retries."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    once = make("""
if not getattr(torch, "_filter_oom_once", False):
    torch._filter_oom_once = True
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
return torch.relu(x) * 2 + x""", task_id="oom_once")
    cfg = FilterConfig(**FAST, device="cuda", check_dead=False, oom_retries=1)
    v = check_task(once, cfg)
    assert v.accepted and v.oom_retries == 1, (v.reason, v.detail)
    always = make('raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")', task_id="oom")
    v = check_task(always, cfg)
    assert not v.accepted and v.reason == "out_of_memory" and v.oom_retries == 1 and "Tried to allocate" in v.detail


@pytest.mark.gpu
def test_checks_on_the_gpu_draw_on_the_device_and_still_catch_dead_parts():
    """On CUDA the filter draws the inputs on the device as the sandbox does (build_and_run(on_device=True): a CPU
    draw costs seconds per GPU-sized input set), perturbs them there, and still tells a live task from one with an
    unused input or a dead op; a get_inputs() that needs the CPU (.numpy()) is drawn there, reseeded."""
    import torch

    from tasks.validate import build_and_run, load_checked

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    cfg = FilterConfig(**FAST, device="cuda")
    live = make("return torch.relu(x) * 2 + x", task_id="live")
    assert check_task(live, cfg).accepted
    assert check_task(make("return torch.relu(x) * 2", two_inputs=True), cfg).reason == "input_unused"
    assert check_task(make("return x + torch.clamp(x, -1.0, 1.0) * 0.0"), cfg).reason == "dead_op"
    mod = load_checked(live.reference, "<live>")
    model, inputs, out = build_and_run(mod, "<live>", device="cuda", on_device=True)
    assert inputs[0].is_cuda and out[0].is_cuda
    _, again, _ = build_and_run(mod, "<live>", device="cuda", on_device=True)
    assert torch.equal(inputs[0], again[0])  # seeded on the device as on the CPU
    numpy_src = live.reference.replace("return [torch.randn(batch_size, dim)]",
                                       "return [torch.from_numpy(torch.randn(batch_size, dim).numpy())]")
    assert numpy_src != live.reference
    _, cpu_drawn, _ = build_and_run(load_checked(numpy_src, "<numpy>"), "<numpy>", device="cuda", on_device=True)
    torch.manual_seed(0)
    assert torch.equal(cpu_drawn[0].cpu(), torch.randn(64, 256))  # drawn again on the CPU, reseeded


def test_lock_waits_are_counted_over_every_autosize_round(tmp_path, monkeypatch):
    """Verdict.lock_wait_s sums the waits of every attempt (each autosize round checks the task again with a fresh
    Verdict): a wait in the first round is still in the final verdict after the task was re-sized."""
    import multiprocessing as mp
    import threading

    import tasks.filtering as filtering
    from sandbox.service_lock import DeviceTimingLock

    lock = DeviceTimingLock("gpu-test", lock_dir=tmp_path)
    monkeypatch.setattr(filtering, "_device_lock", lambda cfg: lock)  # the GPU's lock, on the CPU backend here
    ctx = mp.get_context("spawn")
    ready, release = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold_lock, args=(str(tmp_path), ready, release))
    holder.start()
    try:
        assert ready.wait(60)
        threading.Timer(0.5, release.set).start()  # a sandbox node's timer holds the GPU for the first 0.5 s
        cfg = FilterConfig(check_compile=False, check_dead=False, autosize=True, eager_window_ms=[0.5, 1.0],
                           timing_lock_timeout_s=20.0, warmup=0, min_reps=1, max_reps=1)
        v = check_task(make("return torch.relu(x) * 2 + x"), cfg)
    finally:
        release.set()
        holder.join(30)
    assert v.resized_params, (v.reason, v.detail)  # at least one round after the first
    assert v.lock_wait_s >= 0.4, v.lock_wait_s


def test_timing_waits_for_the_gpu_lock_and_flags_a_timing_taken_without_it(tmp_path):
    """The timed sections take the GPU's timing lock (sandbox.service_lock) exclusively: held by another process,
    the timing waits timing_lock_timeout_s, then runs anyway and the verdict says contended."""
    import multiprocessing as mp
    import time

    from sandbox.service_lock import DeviceTimingLock
    from tasks.filtering import Verdict, _timed_ms

    lock = DeviceTimingLock("gpu-test", lock_dir=tmp_path)
    cfg = FilterConfig(**FAST, timing_lock_timeout_s=0.3, min_reps=1, max_reps=1, warmup=0)
    v = Verdict(task_id="t", accepted=False)
    _timed_ms(lock, v, lambda: None, "cpu", cfg)
    assert not v.contended  # free: held for the section
    ready, release = mp.get_context("spawn").Event(), mp.get_context("spawn").Event()
    holder = mp.get_context("spawn").Process(target=_hold_lock, args=(str(tmp_path), ready, release))
    holder.start()
    try:
        assert ready.wait(60)
        t0 = time.monotonic()
        _timed_ms(lock, v, lambda: None, "cpu", cfg)
        assert v.contended and time.monotonic() - t0 >= 0.3
        assert 0.3 <= v.lock_wait_s < time.monotonic() - t0 + 0.05  # the wait is counted
    finally:
        release.set()
        holder.join(30)


def _hold_lock(lock_dir: str, ready, release) -> None:
    from sandbox.service_lock import DeviceTimingLock

    with DeviceTimingLock("gpu-test", lock_dir=lock_dir).timing(5.0) as st:
        assert st.acquired
        ready.set()
        release.wait(60)


def test_lock_files_that_cannot_be_opened_do_not_stop_the_filter(tmp_path):
    """Lock files this user may not open (here: the lock folder's path is a file) leave the work running: untimed
    sections without the lock, timed ones flagged contended."""
    from sandbox.service_lock import DeviceTimingLock
    from tasks.filtering import Verdict, _SharedGpu, _timed_ms

    (tmp_path / "locks").write_text("not a folder")
    lock = DeviceTimingLock("gpu-test", lock_dir=tmp_path / "locks")
    cfg = FilterConfig(**FAST, min_reps=1, max_reps=1, warmup=0)
    ran = []
    v = Verdict(task_id="t", accepted=False)
    with _SharedGpu(lock, cfg, v):
        ran.append(1)
    _timed_ms(lock, v, lambda: ran.append(2), "cpu", cfg)
    assert ran == [1, 2] and v.contended


def test_untimed_gpu_work_lets_a_waiting_timer_in_between_two_forwards(tmp_path):
    """While the filter holds the GPU's lock shared over its liveness pass, a sandbox node's timer that asks for the
    lock gets it at the filter's next pause (between two forwards), not at the end of the pass; the filter then
    waits for the timer's section and carries on with the lock held again, and counts the wait (lock_wait_s)."""
    import multiprocessing as mp
    import time

    from sandbox.service_lock import DeviceTimingLock
    from tasks.filtering import Verdict, _SharedGpu

    lock = DeviceTimingLock("gpu-test", lock_dir=tmp_path)
    v = Verdict(task_id="t", accepted=False)
    cfg = FilterConfig(**FAST, timing_lock_timeout_s=20.0)
    ctx = mp.get_context("spawn")
    got = ctx.Queue()
    with _SharedGpu(lock, cfg, v) as share:
        assert v.lock_wait_s < 0.25  # nobody held it
        timer = ctx.Process(target=_time_under_lock, args=(str(tmp_path), 0.3, got))
        timer.start()
        deadline = time.monotonic() + 60
        while not lock.timing_requested():
            assert time.monotonic() < deadline, "the timer never asked for the lock"
            time.sleep(0.01)
        t0 = time.monotonic()
        share.pause()
        waited_s = time.monotonic() - t0
        assert share.use.held  # held again
        acquired, wait_ms = got.get(timeout=30)
    timer.join(30)
    assert acquired and waited_s >= 0.25, (acquired, wait_ms, waited_s)
    assert waited_s - 0.05 <= v.lock_wait_s <= waited_s + 0.25, (v.lock_wait_s, waited_s)
    share.pause()  # nobody waits (and the section is closed): nothing happens


def _time_under_lock(lock_dir: str, hold_s: float, got) -> None:
    import time

    from sandbox.service_lock import DeviceTimingLock

    with DeviceTimingLock("gpu-test", lock_dir=lock_dir).timing(20.0) as st:
        time.sleep(hold_s)
    got.put((st.acquired, st.wait_ms))


def test_pool_admits_tasks_by_their_memory_charge_per_gpu():
    """The pool's device-memory admission (FilterConfig.device_memory_fraction): a free worker gets the first
    queued task whose charge fits in what its GPU has left; a GPU with nothing in flight takes any task; a head
    passed over 2 x workers times stops smaller tasks from passing it. The workers here are the parent's ends of
    real pipes standing in for workers that reported a GPU (no GPU on this machine), so what is dispatched is read
    off the pipes."""
    import multiprocessing as mp

    from tasks.filtering import _Slot, memory_charge_bytes

    cfg = FilterConfig(device="cuda", workers=2, device_memory_fraction=0.5, memory_charge_factor=2.0)
    gib = 1 << 30
    sized = lambda name, gb: make("return x * 2", task_id=name, metadata={"footprint_bytes": gb * gib})  # noqa: E731
    assert memory_charge_bytes(sized("a", 10), cfg) == 20 * gib
    assert memory_charge_bytes(make("return x * 2"), cfg) == 0  # no recorded footprint: no charge
    pool = FilterPool(cfg)
    ends = []
    for gpu in (0, 0):  # two workers sharing one 100 GiB GPU: 50 GiB of charges in flight at most
        mine, theirs = mp.Pipe()
        ends.append(theirs)
        pool._slots.append(_Slot(proc=None, conn=mine, ready=True, gpu=gpu, memory_bytes=100 * gib))
    sent = lambda i: ends[i].recv()["id"] if ends[i].poll(0.5) else None  # noqa: E731
    pool._queue = [sized("big", 20), sized("big2", 20), sized("small", 2)]
    pool._dispatch()
    # worker 0 takes "big" (charge 40 GiB); worker 1 may not take "big2" (40 + 40 > 50) but takes "small" (4)
    assert (sent(0), sent(1)) == ("big", "small")
    assert [t.id for t in pool._queue] == ["big2"] and pool._slots[0].charge == 40 * gib
    # "small" finishes: "big2" still does not fit beside "big", the free worker waits
    pool._slots[1].task, pool._slots[1].charge = None, 0
    pool._dispatch()
    assert sent(1) is None and pool.admission_waits == 1
    # "big" finishes too: "big2" goes
    pool._slots[0].task, pool._slots[0].charge = None, 0
    pool._dispatch()
    assert sent(0) == "big2" and not pool._queue
    # the head ("big3", 40) does not fit beside "big2" (40): small tasks (2) pass it, 2 x workers times, then it
    # is the only one that may go, and it waits
    pool._queue = [sized("big3", 20)] + [sized(f"s{i}", 1) for i in range(8)]
    got = []
    for _ in range(8):
        pool._dispatch()
        name = sent(1)
        if name:
            got.append(name)
            pool._slots[1].task, pool._slots[1].charge = None, 0
    assert got == ["s0", "s1", "s2", "s3"], got
    assert pool._queue[0].id == "big3"
    # "big2" finishes: the GPU is empty, so a task over the whole share goes alone
    pool._slots[0].task, pool._slots[0].charge = None, 0
    pool._queue = [sized("huge", 60)] + pool._queue
    pool._dispatch()
    assert sent(0) == "huge" and pool._slots[0].charge == 120 * gib
    assert sent(1) is None  # and nothing goes beside it
    # a CPU pool admits everything (no GPU reported)
    cpu = FilterPool(FilterConfig(workers=1))
    mine, theirs = mp.Pipe()
    cpu._slots.append(_Slot(proc=None, conn=mine, ready=True))
    cpu._queue = [sized("any", 10 ** 6)]
    cpu._dispatch()
    assert theirs.recv()["id"] == "any"


def test_memory_admission_settings_are_validated():
    with pytest.raises(ValueError, match="device_memory_fraction"):
        FilterConfig(device_memory_fraction=1.5)
    with pytest.raises(ValueError, match="memory_charge_factor"):
        FilterConfig(memory_charge_factor=0)
