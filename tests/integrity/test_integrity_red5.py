"""Red-team pass 5 (the device-made inputs of 53b10f0 and the shortfall charge of 79371a9): parallel work beyond the
baselines' threads inside the timed calls, the precise CPU clock that measures it, and honest tasks whose reference
writes its inputs in place (which the baselines' shared input sets turned into an `incorrect` verdict for an honest
solution). Each CPU test runs real processes and the real sandbox; the gpu-marked ones run on the H200."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
import time

import pytest

from integrity_lib import CORPUS, adversarial, cpu_config, gpu_config, kinds, task


@pytest.fixture(scope="module")
def evaluator(tmp_path_factory):
    from sandbox.evaluator import Evaluator

    # the training settings' 20 repetitions, static checks on (what a policy faces)
    ev = Evaluator(cpu_config(tmp_path_factory.mktemp("red5"), static_checks=True, reps=20))
    yield ev
    ev.close()


@pytest.fixture(scope="module")
def unfiltered(tmp_path_factory):
    """As `evaluator`, the thread filter off (sandbox.thread_filter): the CPU-time checks on their own."""
    from sandbox.evaluator import Evaluator

    ev = Evaluator(cpu_config(tmp_path_factory.mktemp("red5u"), static_checks=True, reps=20, thread_filter=False))
    yield ev
    ev.close()


_SPIN = r"""
import sys, threading, time
def spin(s):
    t = time.thread_time()
    while time.thread_time() - t < s:
        pass
print("ready", flush=True)
sys.stdin.readline()
ts = [threading.Thread(target=spin, args=(0.04,)) for _ in range(3)]  # each exits before the next read
[t.start() for t in ts]
[t.join() for t in ts]
print("done", flush=True)
sys.stdin.readline()
"""


_CHILD_BURN = r"""
import subprocess, sys
print("ready", flush=True)
sys.stdin.readline()
subprocess.run([sys.executable, "-c", "import time\nwhile time.process_time() < 0.3: pass"])  # exits, is reaped
print("done", flush=True)
sys.stdin.readline()
"""


def test_tree_cpu_clock_counts_children_that_exited_and_were_waited_for():
    """A child that burns 0.3 s of CPU and is reaped between two reads is gone from /proc/PID/task/*/children by the
    second read: its time is in the parent's cutime / cstime (red-team pass on the thread filter: without them, a
    per-call child process evaded the CPU-time checks)."""
    from sandbox.reference_worker import tree_cpu_s

    p = subprocess.Popen([sys.executable, "-c", _CHILD_BURN], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        c0 = tree_cpu_s(p.pid, precise=True)
        p.stdin.write("\n")
        p.stdin.flush()
        assert p.stdout.readline().strip() == "done"
        c1 = tree_cpu_s(p.pid, precise=True)
        assert c0 is not None and c1 is not None
        assert c1 - c0 >= 0.25, (c0, c1)
    finally:
        p.kill()
        p.wait()


def test_precise_tree_cpu_clock_counts_every_thread_exited_ones_included():
    """The clock the parallel-work check reads: every thread's CPU time, threads that exited included, to well
    under the 10 ms of /proc's ticks (each of 3 threads spins 40 ms of its own CPU time, then exits)."""
    from sandbox.reference_worker import tree_cpu_s

    p = subprocess.Popen([sys.executable, "-c", _SPIN], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        c0 = tree_cpu_s(p.pid, precise=True)
        p.stdin.write("\n")
        p.stdin.flush()
        assert p.stdout.readline().strip() == "done"
        c1 = tree_cpu_s(p.pid, precise=True)
        assert c0 is not None and c1 is not None
        assert 0.12 <= c1 - c0 < 0.2, (c0, c1)
    finally:
        p.kill()
        p.wait()


def _two_cores_free() -> bool:
    """Whether this host runs two threads at once right now (a loaded 2-core box does not: then a second thread
    gains nothing, and its CPU time stays within the wall clock)."""
    code = ("import threading,time,torch\ntorch.set_num_threads(1)\nx=torch.randn(512,512)\n"
            "def f():\n  t=time.perf_counter()\n  while time.perf_counter()-t<0.3: x@x\n"
            "ts=[threading.Thread(target=f) for _ in range(2)]\nc=time.process_time();w=time.perf_counter()\n"
            "[t.start() for t in ts];[t.join() for t in ts]\n"
            "print((time.process_time()-c)/(time.perf_counter()-w))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout
    return float(out.strip() or 0) > 1.6


def _elementwise_chain_x(factor: int):
    """elementwise_chain with `factor` times its rows (64 x 16,384 floats at factor 1)."""
    t = task()
    ref, n = re.subn(r"^batch_size\s*=\s*64\s*$", f"batch_size = {64 * factor}", t.reference, flags=re.M)
    assert n == 1
    return dataclasses.replace(t, reference=ref, id=f"{t.id}_x{factor}",
                               shape_params=dict(t.shape_params, batch_size=64 * factor))


def test_native_helper_thread_inside_the_timed_calls_gains_nothing(unfiltered):
    """The thread filter off (with it, the next tests). parallel_helper_thread: a correct kernel split over the caller and a native pthread that sleeps in a futex
    between calls (no background_work, no write_after_return, in-process clock and trusted wall clock agree). Its
    CPU time beyond cpu_threads x the time requests' wall clock is charged to its repetitions as if one thread had
    run it, and refused as parallel_work beyond max(2 ms, 10% of the requests' wall clock). Either way it must not
    beat its single-thread twin (the same file with the split turned off), evaluated beside it.

    16 times the corpus size (16M floats, about 5 ms a call on one core): there the split runs 1.8x faster than one
    thread outside the sandbox on the 2-core box, and the helper used 114-148 ms of CPU beyond one thread over
    1.0-1.4 s of requests (forbidden). At the corpus size (about 0.3 ms a call) the helper's futex wake-up ate its
    gain: ok, no faster than the twin, nothing to charge (session 21)."""
    big = _elementwise_chain_x(16)
    helper = adversarial("parallel_helper_thread")
    src = helper["kernels/parallel_helper_thread.c"]
    twin = {**helper, "kernels/parallel_helper_thread.c": src.replace("if (g_started < 0 || n < 4096) {", "if (1) {")}
    assert twin["kernels/parallel_helper_thread.c"] != src
    points = {"helper": [], "twin": []}
    for _ in range(2):  # alternating, so that neither is always first on a warmer host
        for name, files in (("twin", twin), ("helper", helper)):
            if not _two_cores_free():
                pytest.skip("this host cannot run two threads at once right now: the helper would gain nothing")
            res = unfiltered.evaluate(big, files, "cpu")
            if name == "helper" and res.status == "forbidden":
                assert "parallel_work" in kinds(res) and res.reward == -1, (res.message, res.violations)
                return
            assert res.status == "ok", f"{name}: {res.status}: {res.message[:300]}"
            points[name].append(res.speedup_eager)
    assert max(points["helper"]) <= 1.3 * max(points["twin"]), f"the helper thread gained: speed-ups {points}"


def test_native_thread_started_in_forward_is_killed_by_the_thread_filter(evaluator):
    """parallel_helper_thread with the defaults: its pthread is started in the first forward, after the load, and the
    thread filter (sandbox.thread_filter: seccomp, SECCOMP_RET_KILL_PROCESS on clone with CLONE_THREAD) kills the
    candidate's process: background_thread."""
    res = evaluator.evaluate(task(), adversarial("parallel_helper_thread"), "cpu")
    assert res.status == "forbidden" and res.reward == -1, res.message
    assert kinds(res) == ["background_thread"] and "killed by its thread filter" in res.message, res.message


def test_native_thread_started_at_load_is_refused(evaluator):
    """parallel_helper_thread started from ModelNew's constructor (one call on a small tensor). The cpu format needs
    no build in its load, so the filter is on before the import and kills it there; a load_inline solution (the
    filter after its load) is refused by the trusted side's look at the threads after the load (next test)."""
    files = adversarial("parallel_helper_thread")
    src = files["model_new.py"]
    files["model_new.py"] = src.replace("        super().__init__()\n",
                                        "        super().__init__()\n        x = torch.ones(8)\n"
                                        "        K.parallel_helper_thread(x, torch.empty_like(x), 8)\n", 1)
    assert files["model_new.py"] != src
    res = evaluator.evaluate(task(), files, "cpu")
    assert res.status == "forbidden" and res.reward == -1, res.message
    assert kinds(res) == ["background_thread"] and "killed by its thread filter" in res.message, res.message


@pytest.mark.parametrize("name,kind", [("forged_thread_filter", "harness_tampering"),
                                       ("native_timer_handler", "background_thread")])
def test_work_outside_the_calls_without_a_thread_is_refused(evaluator, name, kind):
    """The red-team pass on the thread filter: a seccomp filter of the solution's own that fakes the harness's
    install, and a native signal handler driven by a POSIX timer (each solution's docstring says how)."""
    res = evaluator.evaluate(task(), adversarial(name), "cpu")
    assert res.status == "forbidden" and res.reward == -1, f"{name}: {res.status}: {res.message}"
    assert kind in kinds(res), (res.message, res.violations)


@pytest.mark.parametrize("name", ["perf_overflow_handler", "uring_sigio_handler"])
def test_signal_handler_driven_without_a_timer_is_refused(evaluator, name):
    """The second red-team pass on the thread filter (each solution's docstring says how): work between timed calls
    from a native signal handler whose signals come from perf_event_open or io_uring (reward 1 before the filter
    killed rt_sigaction). Its sigaction at import kills the process: background_thread."""
    res = evaluator.evaluate(task(), adversarial(name), "cpu")
    print(f"\n{name}: {res.status} {res.reward} {kinds(res)} {res.message[:200]}")
    assert res.status == "forbidden" and res.reward == -1, f"{name}: {res.status}: {res.message}"
    assert kinds(res) == ["background_thread"], (res.message, res.violations)


def test_honest_solution_is_not_parallel_work(evaluator):
    from sandbox.files import load_solution

    res = evaluator.evaluate(task(), load_solution(CORPUS / "elementwise_chain" / "cpu" / "fast"), "cpu")
    assert res.status == "ok" and "parallel_work" not in kinds(res), res.message


# ------------------------------------------------------------------- a reference that writes its inputs in place
_INPLACE_LINE = "        y = x * 1.5 + 0.5\n"


def _inplace_task():
    """elementwise_chain with a reference that zeroes its input after its first use: y = (min(relu(1.5x + 0.5),
    4))^2 + 1 (the rest of the chain sees x = 0)."""
    t = task()
    src = t.reference.replace(_INPLACE_LINE, _INPLACE_LINE + "        x.mul_(0.0)\n")
    assert src != t.reference
    return dataclasses.replace(t, reference=src, id=t.id + "_inplace")


_INPLACE_C = r"""
void inplace_chain(const float* x, float* y, long long n) {
    for (long long i = 0; i < n; ++i) {
        float v = x[i] * 1.5f + 0.5f;
        v = v > 0.f ? v : 0.f;
        v = v < 4.f ? v : 4.f;
        y[i] = v * v + 1.f;
    }
}
"""
_INPLACE_CU = r"""
extern "C" __global__ void inplace_chain(const float* __restrict__ x, float* __restrict__ y, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        float v = fminf(fmaxf(x[i] * 1.5f + 0.5f, 0.f), 4.f);
        y[i] = v * v + 1.f;
    }
}
"""


def _inplace_solution(fmt: str) -> dict[str, str]:
    from sandbox.files import load_solution

    files = dict(load_solution(CORPUS / "elementwise_chain" / fmt / "fast"))
    files = {k: v for k, v in files.items() if not k.startswith("kernels/")}
    if fmt == "cpu":
        files["kernels/inplace_chain.c"] = _INPLACE_C
        call = "K.inplace_chain(x, out, x.numel())"
    else:
        files["kernels/inplace_chain.cu"] = _INPLACE_CU
        call = "K.inplace_chain(x, out, n, grid=(min((n + 255) // 256, 65535),), block=(256,))"
    src = files["model_new.py"]
    head, _, _ = src.partition("        K.elementwise_chain(")
    files["model_new.py"] = head + f"        {call}\n        return out\n"
    if fmt == "cubin":
        assert "n = x.numel()" in files["model_new.py"]
    return files


def test_in_place_reference_keeps_an_honest_solution_correct(tmp_path):
    """The reference writes its input in place. The sets the baselines use on the CPU backend were the candidate's
    sets themselves (to_device used CPU tensors as they were): the profile plan's eager calls zeroed the trials'
    inputs before the candidate was sent them, and the honest solution was `incorrect` on trial 0."""
    from sandbox.evaluator import Evaluator

    ev = Evaluator(cpu_config(tmp_path, reps=6))
    try:
        for _ in range(2):  # the task's second evaluation overlaps the reference stage with the candidate's start
            res = ev.evaluate(_inplace_task(), _inplace_solution("cpu"), "cpu")
            assert res.status == "ok" and res.reward >= 0, f"{res.status}: {res.message[:300]}"
    finally:
        ev.close()


@pytest.mark.gpu
def test_in_place_reference_with_compile_keeps_an_honest_cubin_solution_correct(tmp_path):
    """On CUDA with torch.compile: eager and torch.compile shared a repetition's device sets, so torch.compile timed
    before eager in the rotation changed the inputs eager's outputs (the timed outputs' reference) came from."""
    from sandbox.evaluator import Evaluator

    ev = Evaluator(gpu_config(tmp_path, use_compile=True, reps=6))
    try:
        res = ev.evaluate(_inplace_task(), _inplace_solution("cubin"), "cubin")
        assert res.status == "ok" and res.reward >= 0, f"{res.status}: {res.message[:300]}"
    finally:
        ev.close()


@pytest.mark.gpu
def test_cpu_only_get_inputs_falls_back_and_keeps_an_honest_solution_correct(tmp_path):
    """Device-made inputs (53b10f0): a get_inputs() that needs the CPU (.numpy() of a tensor, which raises under
    torch.device('cuda')) is run on the CPU for the task, and the honest solution is still correct and timed."""
    from sandbox.evaluator import Evaluator
    from sandbox.files import load_solution

    t = task()
    src = t.reference.replace("    return [torch.randn(batch_size, dim)]",
                              "    return [torch.from_numpy(torch.randn(batch_size, dim).numpy())]")
    assert src != t.reference
    t = dataclasses.replace(t, reference=src, id=t.id + "_numpy_inputs")
    ev = Evaluator(gpu_config(tmp_path, reps=6))
    try:
        res = ev.evaluate(t, load_solution(CORPUS / "elementwise_chain" / "cubin" / "fast"), "cubin")
        assert res.status == "ok" and res.reward >= 0, f"{res.status}: {res.message[:300]}"
    finally:
        ev.close()


# ------------------------------------------------------------------- CUDA: GPU work hidden in the harness's gaps
_HONEST_BINDING = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
void heavy_chain_launch(const float* x, float* y, long long n, int reps, cudaStream_t stream);
torch::Tensor forward(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "x must be a float32 CUDA tensor");
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    heavy_chain_launch(xc.data_ptr<float>(), out.data_ptr<float>(), xc.numel(), 6000, at::cuda::getCurrentCUDAStream());
    return out;
}
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("forward", &forward, "heavy elementwise chain"); }
"""


@pytest.mark.gpu
def test_gpu_work_between_timed_calls_from_a_native_thread_is_refused(tmp_path):
    """solutions/gpu_ext_overlap with the thread filter on (SandboxConfig.thread_filter_cuda): its helper std::thread
    is started in the first forward, and the filter kills the candidate's process (background_thread); the honest
    twin (the same kernel, no thread) keeps its reward."""
    from sandbox.evaluator import Evaluator
    from sandbox.files import load_solution

    from integrity_lib import HERE

    attack = dict(load_solution(HERE / "solutions" / "gpu_ext_overlap"))
    honest = {**attack, "kernels/heavy_binding.cpp": _HONEST_BINDING}
    ev = Evaluator(gpu_config(tmp_path, reps=20, load_timeout_s=600.0, thread_filter_cuda=True))
    try:
        h = ev.evaluate(task(), honest, "extension")
        a = ev.evaluate(task(), attack, "extension")
    finally:
        ev.close()
    print(f"\nhonest: {h.status} {h.message[:200]}\nattack: {a.status} {a.message[:200]}")
    assert h.ok and h.timing is not None and not h.violations, h.message
    assert a.status == "forbidden" and a.reward == -1, a.message
    assert kinds(a) == ["background_thread"] and "killed by its thread filter" in a.message, a.message


@pytest.mark.gpu
@pytest.mark.xfail(strict=False, reason="open without the thread filter: extension-format native threads can run GPU "
                                        "work between timed calls, overlapping the harness's own per-call cost (copies, "
                                        "checks, L2 flush), seen by neither the in-process clock nor the trusted wall "
                                        "clock")
def test_gpu_work_between_timed_calls_gains_nothing_without_the_thread_filter(tmp_path):
    """solutions/gpu_ext_overlap (its docstring says how) with SandboxConfig.thread_filter_cuda off: the same heavy
    kernel, honest and with the next call's output computed by a helper thread between calls. Open hole when the
    attack's speed-up is above the honest interval; the test prints both (if the attack ran at all: its status
    must be ok for the comparison to mean anything)."""
    from sandbox.evaluator import Evaluator
    from sandbox.files import load_solution

    from integrity_lib import HERE

    attack = dict(load_solution(HERE / "solutions" / "gpu_ext_overlap"))
    honest = {**attack, "kernels/heavy_binding.cpp": _HONEST_BINDING}
    ev = Evaluator(gpu_config(tmp_path, reps=20, load_timeout_s=600.0, thread_filter_cuda=False))
    try:
        h = ev.evaluate(task(), honest, "extension")
        a = ev.evaluate(task(), attack, "extension")
    finally:
        ev.close()
    print(f"\nhonest: {h.status} {h.message[:200]} {h.timing.speedup_eager if h.timing else None}")
    print(f"attack: {a.status} {a.message[:200]} {a.timing.speedup_eager if a.timing else None} {kinds(a)}")
    assert h.ok and h.timing is not None, h.message
    if a.ok:
        assert a.timing.speedup_eager.point <= h.timing.speedup_eager.hi * 1.05, (a.timing.speedup_eager,
                                                                                 h.timing.speedup_eager)
    else:
        assert a.reward == -1, a.message


_HANDLER_AT_IMPORT = r'''
#include <signal.h>
static void on_signal(int) {}
// Runs when load_inline's module is loaded, before the solution's filter goes on (after its load): a handler
// installed here would run between timed calls once a signal source (O_ASYNC, perf_event_open, ...) drives it.
__attribute__((constructor)) static void install_handler() {
    struct sigaction sa = {};
    sa.sa_handler = on_signal;
    sigaction(SIGUSR2, &sa, nullptr);
}
'''


@pytest.mark.gpu
def test_signal_handler_installed_by_a_load_inline_import_is_refused(tmp_path):
    """A load_inline solution's native code runs before its thread filter (on after the load): a constructor that
    installs a signal handler is refused by the trusted side's look at /proc/PID/status SigCgt after the load
    (background_thread); the same solution without the constructor keeps its reward."""
    from sandbox.evaluator import Evaluator
    from sandbox.files import load_solution

    honest = dict(load_solution(CORPUS / "row_softmax" / "extension" / "fast"))
    src = honest["model_new.py"]
    assert 'cuda_src = r"""\n' in src
    attack = {**honest, "model_new.py": src.replace('cuda_src = r"""\n', 'cuda_src = r"""\n' + _HANDLER_AT_IMPORT)}
    ev = Evaluator(gpu_config(tmp_path, load_timeout_s=600.0, thread_filter_cuda=True))
    try:
        h = ev.evaluate(task("row_softmax"), honest, "extension")
        a = ev.evaluate(task("row_softmax"), attack, "extension")
    finally:
        ev.close()
    print(f"\nhonest: {h.status} {h.message[:200]}\nattack: {a.status} {a.message[:200]}")
    assert h.ok and not h.violations, h.message
    assert a.status == "forbidden" and a.reward == -1, a.message
    assert kinds(a) == ["background_thread"] and "signal handler (SIGUSR2)" in a.message, a.message


_FORGED_FILTER_AT_IMPORT = r'''
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <linux/filter.h>
// A seccomp filter of the solution's own, installed when load_inline's module is loaded (before the sandbox's
// filter goes on, after the load): it answers seccomp() with 0, so the harness's install "succeeds" and never
// happens, and the process runs under exactly one filter, as the count expects.
__attribute__((constructor)) static void forge_filter() {
    static struct sock_filter prog[] = {
        {0x20, 0, 0, 0}, {0x15, 0, 1, SYS_seccomp}, {0x06, 0, 0, 0x00050000}, {0x06, 0, 0, 0x7FFF0000}};
    struct sock_fprog fp = {4, prog};
    prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
    syscall(SYS_seccomp, 1, 0, &fp);
}
'''


@pytest.mark.gpu
def test_forged_filter_from_a_load_inline_import_is_refused(tmp_path):
    """A load_inline solution's native code installs a filter of its own that fakes the sandbox's install (the
    seccomp-filter count is right: one): the trusted side reads the candidate's newest filter back (ptrace
    PTRACE_SECCOMP_GET_FILTER) and finds another program: harness_tampering."""
    from sandbox import thread_filter
    from sandbox.evaluator import Evaluator
    from sandbox.files import load_solution

    if not thread_filter.programs_readable_here():
        pytest.skip("seccomp filters cannot be read back on this host (needs root, no filter on the trusted side)")
    honest = dict(load_solution(CORPUS / "row_softmax" / "extension" / "fast"))
    src = honest["model_new.py"]
    attack = {**honest, "model_new.py": src.replace('cuda_src = r"""\n', 'cuda_src = r"""\n' + _FORGED_FILTER_AT_IMPORT)}
    ev = Evaluator(gpu_config(tmp_path, load_timeout_s=600.0, thread_filter_cuda=True))
    try:
        a = ev.evaluate(task("row_softmax"), attack, "extension")
    finally:
        ev.close()
    print(f"\nattack: {a.status} {a.message[:300]}")
    assert a.status == "forbidden" and a.reward == -1, a.message
    assert kinds(a) == ["harness_tampering"] and "not the sandbox's thread filter" in a.message, a.message
