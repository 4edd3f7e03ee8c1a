"""Every cubin solution of the corpus compiles with nvcc for sm_90a in CI (no GPU needed), its entry points are
parsed, and the kernels model_new.py launches exist in the build."""

import concurrent.futures as cf
import re
import shutil

import pytest

from sandbox.build import build
from sandbox.config import SandboxConfig
from sandbox.files import load_solution
from sandbox.workspace import Workspace
from sandbox_testlib import CORPUS, TASKS, VARIANTS

pytestmark = [pytest.mark.slow, pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")]


def test_cubin_corpus_compiles(tmp_path):
    cfg = SandboxConfig(cache_dir=str(tmp_path / "cache"), cuda_arch="sm_90a")
    jobs = [(t, v) for t in TASKS for v in VARIANTS]

    def one(tv):
        t, v = tv
        files = load_solution(CORPUS / t / "cubin" / v)
        ws = Workspace.create(tmp_path / "ws", "", files, "cubin")
        res = build(ws, "cubin", cfg, None, "sm_90a")
        launched = set(re.findall(r"\bK\.(\w+)\(", files["model_new.py"]))
        return t, v, res, launched

    with cf.ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(one, jobs))
    assert len(results) == len(TASKS) * len(VARIANTS) >= 40
    for t, v, res, launched in results:
        assert res.ok, f"{t}/{v}: {res.log}"
        import json

        names = {ep["name"] for a in json.loads(open(res.manifest_path).read())["artifacts"] for ep in a["entry_points"]}
        assert launched and launched <= names, f"{t}/{v}: launches {launched}, built {names}"
