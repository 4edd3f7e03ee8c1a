"""On a CUDA host (the H200): the cubin corpus end to end, the extension format on three tasks (built in
parallel), the launcher on torch's current stream, and NVML readings next to each timing."""

import concurrent.futures as cf
import os

import pytest
import torch

from sandbox.config import SandboxConfig
from sandbox.files import load_solution, load_task
from sandbox_testlib import CORPUS, TASKS, VARIANTS

pytestmark = pytest.mark.gpu

EXPECTED = {"fast": "ok", "slow": "ok", "wrong": "incorrect", "crash": "runtime_error", "hang": "timeout"}


def gpu_config(tmp, **kw) -> SandboxConfig:
    # torch.compile's baseline is left to benchmarks/sandbox_bench.py here: its first call per task costs seconds
    # of scarce device time, and statuses do not depend on it.
    base = dict(backend="cuda", cache_dir=str(tmp / "cache"), work_root=str(tmp / "ws"), trial_timeout_s=4.0,
                reps=10, warmup_calls=2, min_rep_ms=1.0, use_compile=False)
    base.update(kw)
    return SandboxConfig(**base)


@pytest.fixture(scope="module")
def gpu_evaluator(tmp_path_factory):
    from sandbox.evaluator import Evaluator

    # the thread filter off (thread_filter_cuda is on by default): filtered_evaluator covers the default, so the
    # corpus's verdicts are checked both ways
    ev = Evaluator(gpu_config(tmp_path_factory.mktemp("gpu"), thread_filter_cuda=False))
    yield ev
    ev.close()


@pytest.fixture(scope="module")
def filtered_evaluator(tmp_path_factory):
    from sandbox.evaluator import Evaluator

    ev = Evaluator(gpu_config(tmp_path_factory.mktemp("gpu_filtered"), thread_filter_cuda=True))
    yield ev
    ev.close()


@pytest.mark.parametrize("task", TASKS)
def test_cubin_corpus_keeps_its_verdicts_under_the_thread_filter(filtered_evaluator, task):
    """SandboxConfig.thread_filter_cuda on (sandbox.thread_filter: no thread, process or timer from the import on):
    the fast and the crashing solutions keep their verdicts (nothing the CUDA driver or torch does after the import
    starts a thread)."""
    for variant in ("fast", "crash"):
        res = filtered_evaluator.evaluate(load_task(CORPUS / task), load_solution(CORPUS / task / "cubin" / variant),
                                          "cubin")
        print(f"\n{task}/{variant} (thread filter): {res.status} {res.message[:160]} {res.log[-2:]}")
        assert res.status == EXPECTED[variant], f"{task}/{variant}: {res.status}: {res.message}\n{res.log}"
        assert "background_thread" not in [v.kind for v in res.violations], res.message


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("task", TASKS)
def test_cubin_corpus(gpu_evaluator, task, variant):
    res = gpu_evaluator.evaluate(load_task(CORPUS / task), load_solution(CORPUS / task / "cubin" / variant), "cubin")
    print(f"\n{task}/{variant}: {res.status} reward={res.reward} {res.message[:160]} stages="
          f"{ {k: round(v) for k, v in res.stage_ms.items()} }")
    assert res.status == EXPECTED[variant], f"{task}/{variant}: {res.status}: {res.message}\n{res.log}"
    if res.ok:
        assert res.reward >= 0 and res.timing is not None and res.timing.device != "cpu"
        assert len(res.nvml) == 2 and res.nvml[0]["sm_clock_mhz"] > 0
        # the trusted side's device peak (the node's memory admission sizes reservations from it): at least the
        # reference's inputs and outputs, which torch's caching allocator reserves in whole 2 MiB blocks or more
        assert res.device_peak_bytes >= 2 * 2**20, res.device_peak_bytes
    else:
        assert res.reward == -1
        # no out-of-memory error: no free-memory reading (the node's out-of-memory re-run needs one)
        assert res.device_free_fraction == -1.0, res.device_free_fraction


def test_out_of_memory_failure_carries_the_free_memory_read_after_the_candidate_exited(gpu_evaluator):
    """A candidate that really runs the device out of memory (a 40 TB allocation) is answered runtime_error with
    the trusted worker's reading of free device memory, taken once its processes have exited: alone on the GPU,
    most of it is free, so the node would not re-run it."""
    sol = load_solution(CORPUS / "elementwise_chain" / "cubin" / "fast")
    src = sol["model_new.py"]
    assert "out = torch.empty_like(x)" in src
    files = dict(sol, **{"model_new.py": src.replace("out = torch.empty_like(x)",
                                                     "torch.empty(10**13, device=x.device)\n        out = torch.empty_like(x)")})
    res = gpu_evaluator.evaluate(load_task(CORPUS / "elementwise_chain"), files, "cubin")
    print(f"\noom: {res.status} {res.message[:200]} free={res.device_free_fraction}")
    assert res.status == "runtime_error" and "out of memory" in res.message.lower(), res.message
    assert 0.5 < res.device_free_fraction <= 1, res.device_free_fraction


@pytest.mark.parametrize("thread_filter", [False, True])
def test_extension_format_three_tasks_built_in_parallel(tmp_path, thread_filter):
    """thread_filter: SandboxConfig.thread_filter_cuda (sandbox.thread_filter; before the import for the built
    workspaces, after the load for load_inline): honest solutions keep their verdict."""
    from sandbox.evaluator import Evaluator

    cases = [("elementwise_chain", "extension/fast"), ("linear_bias_relu", "extension/fast"),
             ("row_softmax", "extension/fast")]  # the last is KernelBench load_inline (built at import)

    def one(case):
        t, sol = case
        with Evaluator(gpu_config(tmp_path / t, load_timeout_s=60.0, reps=5,
                                  thread_filter_cuda=thread_filter)) as ev:
            return t, ev.evaluate(load_task(CORPUS / t), load_solution(CORPUS / t / sol), "extension")

    with cf.ThreadPoolExecutor(max_workers=3) as pool:
        results = list(pool.map(one, cases))
    for t, res in results:
        print(f"\n{t}: {res.status} {res.message[:200]} stages={ {k: round(v) for k, v in res.stage_ms.items()} }")
        assert res.status == "ok", f"{t}: {res.message}\n{res.compile_log[-2000:]}\n{res.log}"


def test_launcher_uses_torch_current_stream_and_checks_device(tmp_path):
    from sandbox.build import build
    from sandbox.runtime import LaunchArgumentError, load_kernels
    from sandbox.workspace import Workspace

    files = load_solution(CORPUS / "elementwise_chain" / "cubin" / "fast")
    ws = Workspace.create(tmp_path, "", files, "cubin")
    res = build(ws, "cubin", SandboxConfig(cache_dir=str(tmp_path / "cache")), None, "sm_90a")
    assert res.ok, res.log
    K = load_kernels(res.manifest_path)
    x = torch.randn(1 << 20, device="cuda")
    out = torch.empty_like(x)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        K.elementwise_chain(x, out, x.numel(), grid=(4096,), block=(256,))
    s.synchronize()
    y = x * 1.5 + 0.5
    ref = ((torch.clamp(torch.relu(y) - x * 0.25, max=4.0)) ** 2 + 1.0) / (1.0 + x.abs())
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
    with pytest.raises(LaunchArgumentError, match="cuda"):
        K.elementwise_chain(x.cpu(), out, x.numel(), grid=(1,), block=(256,))
    with pytest.raises(LaunchArgumentError, match="grid"):
        K.elementwise_chain(x, out, x.numel())


def test_input_sets_are_made_on_the_device_and_copied_privately(tmp_path):
    """make_inputs on CUDA: tensors made on the device from the seed (same seed, same set); to_device gives a
    private copy (a reference writing its inputs in place leaves the set the candidate is sent alone); a
    get_inputs() that needs the CPU falls back to it; the input segment takes device tensors."""
    from sandbox import shm
    from sandbox.reference_worker import TaskState

    ref = ("import torch\nimport torch.nn as nn\nclass Model(nn.Module):\n    def forward(self, x):\n"
           "        return x.relu_()\n"
           "def get_inputs():\n    return [torch.randn(64, 128), torch.randint(0, 5, (7,))]\n"
           "def get_init_inputs():\n    return []\n")
    st = TaskState(ref, "t", "cuda")
    a, b = st.make_inputs(123), st.make_inputs(123)
    assert st.inputs_on_device and all(t.is_cuda for t in a)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not torch.equal(a[0], st.make_inputs(124)[0])
    dev = st.to_device(a)
    assert dev[0].data_ptr() != a[0].data_ptr()
    before = a[0].clone()
    st.model(*dev[:1])  # relu_ in place on the copy
    assert torch.equal(a[0], before) and not torch.equal(dev[0], before)
    seg = shm.InputSegment(shm.create_fd())
    seg.size(shm.tensor_bytes(a))
    rec = seg.encode(a)
    m = shm.InputMapping(os.dup(seg.fd), seg.nbytes)
    assert torch.equal(m.tensor(rec[0]), a[0].cpu()) and torch.equal(m.tensor(rec[1]), a[1].cpu())
    seg.close()
    cpu_only = ref.replace("return [torch.randn(64, 128), torch.randint(0, 5, (7,))]",
                           "return [torch.from_numpy(torch.randn(64, 128).numpy())]")
    st2 = TaskState(cpu_only, "t2", "cuda")
    x = st2.make_inputs(5)
    assert not st2.inputs_on_device and x[0].device.type == "cpu"
    assert torch.equal(x[0], st2.make_inputs(5)[0])
