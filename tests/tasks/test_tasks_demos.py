"""Demonstrations: coverage goals, reproducibility, every cpu demo verified by the sandbox, every cubin demo
built with nvcc (and verified on a GPU in the `gpu` tests)."""

import json
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tasks import builtin
from tasks.demos import Demo, demonstrations
from tasks.demos.codegen import render
from tasks.demos.ir import Unsupported, translate

DEMOS_FILE = builtin.HERE / "demos.jsonl"


@pytest.fixture(scope="module")
def demos() -> list[Demo]:
    return [Demo.from_dict(json.loads(line)) for line in DEMOS_FILE.read_text().splitlines()]


@pytest.fixture(scope="module")
def tasks_by_id():
    return {t.id: t for name in builtin.SPLITS for t in builtin.load_split(name)}


def test_coverage_goals(demos, tasks_by_id):
    ids = {d.task_id for d in demos}
    assert len(ids) >= 30
    eval_ids = {t.id for s in builtin.EVAL_SPLITS for t in builtin.load_split(s)}
    eval_hashes = {t.content_hash for s in builtin.EVAL_SPLITS for t in builtin.load_split(s)}
    assert not ids & eval_ids
    assert not {tasks_by_id[i].content_hash for i in ids} & eval_hashes
    cats = {tasks_by_id[i].category for i in ids}
    assert len(cats) >= 5 and {"reduction", "matmul"} <= cats
    for i in ids:
        mine = [d for d in demos if d.task_id == i]
        for fmt in ("cpu", "cubin"):
            assert len({d.variant for d in mine if d.format == fmt}) >= 2, (i, fmt)


def test_shipped_demos_are_what_the_generators_make(demos, tasks_by_id):
    by_task: dict = {}
    for d in demos:
        by_task.setdefault(d.task_id, []).append(d)
    for tid, shipped in by_task.items():
        fresh = demonstrations(tasks_by_id[tid])
        assert [d.to_dict() for d in fresh] == [d.to_dict() for d in shipped], tid


def test_translator_rejects_what_it_cannot_generate():
    conv = next(t for t in builtin.load_split("single_op") if t.id == "op_conv2d")
    with pytest.raises(Unsupported, match="Conv2d"):
        translate(conv.reference)
    two_cores = conv.reference  # any reference with a module we do not generate stays uncovered
    assert demonstrations(conv.replace(id="x_conv", reference=two_cores)) == []
    relu = next(t for t in builtin.load_split("single_op") if t.id == "op_relu")
    with pytest.raises(ValueError, match="format"):
        render(translate(relu.reference), "metal", "fused")


def test_compact_demos_are_short_and_pass_the_sandbox():
    """One compact cpu demonstration per core kind: built on the shipped header, correct under the sandbox."""
    from sandbox.config import SandboxConfig
    from sandbox.evaluator import Evaluator
    from tasks.demos.compact import render_compact

    picks = {}
    for t in builtin.load_split("cpu_family_train"):
        kind = translate(t.reference).core_kind
        if kind not in picks:
            picks[kind] = t
    assert set(picks) == {"pointwise", "row", "scan", "gemm"}
    cfg = SandboxConfig(backend="cpu", profile=False, use_compile=False, num_trials=2)
    with Evaluator(cfg) as ev:
        for kind, t in picks.items():
            files = render_compact(translate(t.reference), "cpu")
            assert '#include "cuda_agent.h"' in files["kernels/kernel.cpp"]
            assert sum(len(s) for s in files.values()) < 3000, (kind, t.id)
            res = ev.evaluate(t, files, "cpu")
            assert res.status == "ok", (kind, t.id, res.status, res.message[:300])
    with pytest.raises(ValueError, match="format"):
        render_compact(translate(picks["row"].reference), "extension")


@pytest.mark.slow
def test_every_cpu_demo_passes_the_sandbox(demos, tasks_by_id):
    """Correct on fresh inputs under the sandbox's checks (2 trials each; timing is benchmarked, not tested)."""
    from sandbox.config import SandboxConfig
    from sandbox.evaluator import Evaluator

    cfg = SandboxConfig(backend="cpu", profile=False, use_compile=False, num_trials=2)
    failures = []
    with Evaluator(cfg) as ev:
        for d in (d for d in demos if d.format == "cpu"):
            task = builtin.at_cpu_size(tasks_by_id[d.task_id])
            res = ev.evaluate(task, d.files, "cpu")
            if res.status != "ok":
                failures.append(f"{d.task_id}/{d.variant}: {res.status}: {res.message[:300]}")
    assert not failures, "\n".join(failures)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_every_cubin_demo_builds_with_nvcc(demos, tasks_by_id):
    from sandbox.build import build
    from sandbox.config import SandboxConfig
    from sandbox.static_check import check_kernel_sources, check_model_new
    from sandbox.workspace import Workspace

    root = Path(tempfile.mkdtemp(prefix="demo-cubin-"))
    cfg = SandboxConfig(cache_dir=str(root / "cache"))

    def one(d: Demo) -> str | None:
        v, err = check_model_new(d.files["model_new.py"], "cubin")
        v += check_kernel_sources({k: s for k, s in d.files.items() if k.startswith("kernels/")}, "cubin")
        if v or err:
            return f"{d.task_id}/{d.variant}: static: {err} {v}"
        ws = Workspace.create(root / "ws", tasks_by_id[d.task_id].reference, d.files, "cubin")
        r = build(ws, "cubin", cfg, None, "sm_90a")
        ws.cleanup()
        return None if r.ok else f"{d.task_id}/{d.variant}: {r.status}: {r.log[:500]}"

    with ThreadPoolExecutor(max_workers=2) as pool:
        failures = [f for f in pool.map(one, [d for d in demos if d.format == "cubin"]) if f]
    shutil.rmtree(root, ignore_errors=True)
    assert not failures, "\n".join(failures)


@pytest.mark.gpu
def test_every_cubin_demo_is_correct_on_the_gpu(demos, tasks_by_id):
    """On an H200: every cubin demo verified at the task's own size (GPU-sized tasks at full size). The demos are
    built first on a thread pool (one nvcc per core) into the evaluators' shared build cache, so each evaluation's
    build is a cache hit; then 4 evaluators verify them side by side (no profiling here, so they may share the
    GPU)."""
    import os

    from sandbox.build import build
    from sandbox.config import SandboxConfig
    from sandbox.evaluator import Evaluator
    from sandbox.workspace import Workspace

    root = Path(tempfile.mkdtemp(prefix="demo-gpu-"))
    cfg = SandboxConfig(backend="cuda", profile=False, use_compile=False, num_trials=2, cache_dir=str(root / "cache"))
    cubin = [d for d in demos if d.format == "cubin"]
    evs = [Evaluator(cfg) for _ in range(4)]
    try:
        def prebuild(k_d) -> None:
            k, d = k_d
            ws = Workspace.create(root / f"ws{k}", tasks_by_id[d.task_id].reference, d.files, "cubin")
            build(ws, "cubin", cfg, None, evs[0].arch)  # a failure shows again (with its log) in the evaluation
            ws.cleanup()

        with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
            list(pool.map(prebuild, enumerate(cubin)))

        def verify(k: int) -> list[str]:
            bad = []
            for d in cubin[k::len(evs)]:
                res = evs[k].evaluate(tasks_by_id[d.task_id], d.files, "cubin")
                if res.status != "ok":
                    bad.append(f"{d.task_id}/{d.variant}: {res.status}: {res.message[:300]}")
            return bad

        with ThreadPoolExecutor(max_workers=len(evs)) as pool:
            failures = [f for fs in pool.map(verify, range(len(evs))) for f in fs]
    finally:
        for ev in evs:
            ev.close()
    assert not failures, f"{len(failures)} of {len(cubin)} cubin demos failed:\n" + "\n".join(failures)


def test_vector_math_matches_torch(tmp_path):
    """The branch-free math of the fused cpu kernels, compiled with the sandbox's flags, against torch (float64)."""
    import ctypes
    import subprocess

    import torch

    from tasks.demos.codegen import VECTOR_MATH

    fns = ["vm_exp", "vm_log", "vm_log1p", "vm_sqrt", "vm_tanh", "vm_erf", "vm_sin", "vm_cos", "vm_atan"]
    cases = "\n".join(f"        case {i}: y[k] = {f}(x[k]); break;" for i, f in enumerate(fns))
    src = ("#include <math.h>\n" + VECTOR_MATH + '\nextern "C" void apply(int w, const float* x, float* y, long long n) {\n'
           "    for (long long k = 0; k < n; ++k) switch (w) {\n" + cases + "\n    }\n}\n")
    (tmp_path / "vm.cpp").write_text(src)
    lib_path = tmp_path / "vm.so"
    subprocess.run(["g++", "-O3", "-march=native", "-fPIC", "-fopenmp", "-shared", str(tmp_path / "vm.cpp"), "-o",
                    str(lib_path)], check=True)
    undefined = subprocess.run(["nm", "-D", "--undefined-only", str(lib_path)], capture_output=True, text=True).stdout
    for libm in ("expf", "logf", "log1pf", "sqrtf", "tanhf", "erff", "sinf", "cosf", "atanf"):
        assert f" {libm}@" not in undefined, f"{libm} is called: the fused loops would not vectorise"
    lib = ctypes.CDLL(str(lib_path))
    ref = {0: torch.exp, 1: torch.log, 2: torch.log1p, 3: torch.sqrt, 4: torch.tanh, 5: torch.erf, 6: torch.sin,
           7: torch.cos, 8: torch.atan}
    ranges = {0: (-87.0, 88.0), 1: (1e-30, 1e30), 2: (-0.99, 50.0), 3: (0.0, 1e6), 4: (-20.0, 20.0), 5: (-8.0, 8.0),
              6: (-100.0, 100.0), 7: (-100.0, 100.0), 8: (-1e3, 1e3)}
    for w, f in ref.items():
        lo, hi = ranges[w]
        x = (torch.logspace(-30, 30, 100_001) if w == 1 else torch.linspace(lo, hi, 100_001)).float()
        y = torch.empty_like(x)
        lib.apply(ctypes.c_int(w), ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(y.data_ptr()),
                  ctypes.c_longlong(x.numel()))
        want = f(x.double())
        err = ((y.double() - want).abs() / (want.abs() + 1e-6)).max().item()
        assert err < 2e-5, (fns[w], err)
    specials = torch.tensor([0.0, -1.0, float("inf")])
    y = torch.empty_like(specials)
    lib.apply(ctypes.c_int(1), ctypes.c_void_p(specials.data_ptr()), ctypes.c_void_p(y.data_ptr()), ctypes.c_longlong(3))
    assert y[0] == float("-inf") and y[1].isnan() and y[2] == float("inf")
