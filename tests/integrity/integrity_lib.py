"""Helpers of the reward-integrity tests: adversarial solutions live in solutions/<name>.py (the model_new.py,
with a docstring saying what it tries and which defence must catch it) plus optional kernel files
solutions/<name>.<cpp|cu|c> (the native ones share solutions/adversarial_native.h); they run on top of a corpus
task's honest kernels."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from sandbox.config import SandboxConfig
from sandbox.files import load_solution, load_task

HERE = Path(__file__).resolve().parent
SOLUTIONS = HERE / "solutions"
CORPUS = HERE.parent / "data" / "corpus"


def task(name: str = "elementwise_chain"):
    return load_task(CORPUS / name)


def adversarial(name: str, fmt: str = "cpu", base_task: str = "elementwise_chain") -> dict[str, str]:
    """Files of adversarial solution `name`: the base task's honest kernels, its model_new.py replaced, plus
    solutions/<name>.<ext> as kernels/<name>.<ext> when present, with the headers of solutions/ it includes
    (e.g. adversarial_native.h) beside it in kernels/."""
    files = dict(load_solution(CORPUS / base_task / fmt / "fast"))
    src = (SOLUTIONS / f"{name}.py").read_text()
    doc = ast.get_docstring(ast.parse(src))
    assert doc and "Defence" in doc, f"{name}.py needs a docstring naming what it tries and the defence"
    files["model_new.py"] = src
    for ext in ("cpp", "cu", "c"):
        extra = SOLUTIONS / f"{name}.{ext}"
        if extra.exists():
            text = files[f"kernels/{name}.{ext}"] = extra.read_text()
            for header in re.findall(r'^\s*#\s*include\s*"([\w.-]+\.h(?:pp)?)"', text, flags=re.M):
                if (SOLUTIONS / header).exists():  # a header of this folder (cuda_agent.h is the sandbox's own)
                    files[f"kernels/{header}"] = (SOLUTIONS / header).read_text()
    return files


def cpu_config(tmp: Path, **kw) -> SandboxConfig:
    base = dict(backend="cpu", cache_dir=str(tmp / "cache"), work_root=str(tmp / "ws"), trial_timeout_s=5.0,
                load_timeout_s=60.0, reps=6, warmup_calls=1, min_rep_ms=1.0, bootstrap_samples=500,
                static_checks=False, use_compile=False)
    base.update(kw)
    return SandboxConfig(**base)


def gpu_config(tmp: Path, **kw) -> SandboxConfig:
    base = dict(backend="cuda", cache_dir=str(tmp / "cache"), work_root=str(tmp / "ws"), trial_timeout_s=5.0,
                reps=10, warmup_calls=2, min_rep_ms=1.0, use_compile=False, static_checks=False)
    base.update(kw)
    return SandboxConfig(**base)


def kinds(res) -> list[str]:
    return [v.kind for v in res.violations]
