"""GPU-only hack classes (cubin format on the H200): side streams, L2 persistence windows, device-memory reads
and allocator reuse, patched CUDA timing functions. Their CPU analogues run in CI (test_integrity_timing.py,
test_integrity_memory.py)."""

import pytest

from integrity_lib import adversarial, gpu_config, kinds, task

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def gpu_hack_evaluator(tmp_path_factory):
    from sandbox.evaluator import Evaluator

    ev = Evaluator(gpu_config(tmp_path_factory.mktemp("gpu_integrity")))
    yield ev
    ev.close()


def _eval(ev, name):
    res = ev.evaluate(task(), adversarial(name, "cubin"), "cubin")
    print(f"\n{name}: {res.status} reward={res.reward} {res.message[:200]} violations={kinds(res)}")
    return res


@pytest.mark.parametrize("name", ["gpu_side_stream", "gpu_graph_side_stream"])
def test_side_stream_work_is_counted(gpu_hack_evaluator, name):
    """The honest kernel on a side stream, launched (counted by the launcher) or replayed as a CUDA graph (counted by
    the monitor's wrapper): correct, and no faster than the honest solution's interval; or refused (-1)."""
    from integrity_lib import CORPUS
    from sandbox.files import load_solution

    honest = gpu_hack_evaluator.evaluate(task(), load_solution(CORPUS / "elementwise_chain" / "cubin" / "fast"), "cubin")
    res = _eval(gpu_hack_evaluator, name)
    print(f"honest: {honest.status} reward={honest.reward} {honest.message[:200]}")
    assert honest.ok and honest.timing is not None, f"honest solution: {honest.status}: {honest.message[:400]}"
    if res.ok:
        print(f"{name} speed-up over eager {res.timing.speedup_eager} vs honest {honest.timing.speedup_eager}")
        side = [line for line in res.log if "put work on another stream" in line]
        assert side, f"{name}: no timed call was seen putting work on another stream: {res.log}"
        # every timed call (not only a graph's capture) counted in full: none timed as held-stream work
        assert not [line for line in res.log if line.startswith("profile: gated;")], res.log
        assert res.timing.speedup_eager.point <= honest.timing.speedup_eager.hi * 1.05, (
            f"{name} {res.timing.speedup_eager} vs honest {honest.timing.speedup_eager}")
    else:
        assert res.reward == -1, f"{name}: {res.status} reward {res.reward}: {res.message[:400]}"


def test_l2_persisting_window_through_ctypes_is_forbidden(gpu_hack_evaluator):
    res = _eval(gpu_hack_evaluator, "gpu_l2_persist")
    assert res.status == "forbidden" and res.reward == -1 and "ctypes" in kinds(res), res.message


def test_persisting_l2_reset_is_available_on_the_gpu():
    from sandbox.timing import PersistingL2

    import torch

    torch.cuda.init()
    torch.zeros(1, device="cuda")
    p = PersistingL2()
    assert p.available
    p.reset()  # must not raise; a failing driver call would leave the context in an error state
    torch.cuda.synchronize()
    # a set-aside a solution left (the extension format can set one) is put back to 0 by the next reset, which
    # reads the limit first and sets it only when it is not 0
    import ctypes

    lib = ctypes.CDLL("libcuda.so.1")
    lib.cuCtxSetLimit.argtypes = [ctypes.c_int, ctypes.c_size_t]
    value = ctypes.c_size_t(0)

    def limit() -> int:
        assert lib.cuCtxGetLimit(ctypes.byref(value), PersistingL2.CU_LIMIT_PERSISTING_L2_CACHE_SIZE) == 0
        return value.value

    assert lib.cuCtxSetLimit(PersistingL2.CU_LIMIT_PERSISTING_L2_CACHE_SIZE, 4 << 20) == 0
    assert limit() > 0
    # the reset's own query works on this driver (a failing one would set the limit every time, unseen)
    assert p._get(p._ref, PersistingL2.CU_LIMIT_PERSISTING_L2_CACHE_SIZE) == 0 and p._value.value == limit()
    sets: list = []
    real_set = p._limit
    p._limit = lambda which, v: sets.append(v) or real_set(which, v)
    import time

    parts: dict = {}
    p.reset(parts, time.perf_counter)
    assert limit() == 0 and sets == [0] and set(parts) == {"l2_limit", "l2_reset"}
    p.reset(parts, time.perf_counter)  # already 0: stays 0, not set again
    assert limit() == 0 and sets == [0]
    torch.cuda.synchronize()


def test_device_memory_read_of_a_previous_output_is_incorrect(gpu_hack_evaluator):
    res = _eval(gpu_hack_evaluator, "gpu_memory_scan")
    assert res.status in ("incorrect", "runtime_error") and res.reward == -1, res.message


def test_allocator_reuse_in_timed_calls_is_caught(gpu_hack_evaluator):
    res = _eval(gpu_hack_evaluator, "gpu_allocator_reuse")
    assert res.status == "incorrect" and res.reward == -1 and "timed_output_mismatch" in kinds(res), res.message


def test_patched_cuda_sync_and_events_are_caught(gpu_hack_evaluator):
    res = _eval(gpu_hack_evaluator, "gpu_patch_sync")
    assert res.status == "forbidden" and res.reward == -1
    assert {"timer_tampering", "monkeypatch"} & set(kinds(res)), res.violations
