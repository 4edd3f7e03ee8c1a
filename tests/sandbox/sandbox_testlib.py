"""Helpers shared by the sandbox tests (corpus location, a fast CPU SandboxConfig)."""

from __future__ import annotations

from pathlib import Path

from sandbox.config import SandboxConfig

CORPUS = Path(__file__).resolve().parent.parent / "data" / "corpus"
TASKS = sorted(p.name for p in CORPUS.iterdir() if (p / "model.py").exists())
VARIANTS = ("fast", "slow", "wrong", "crash", "hang")


def cpu_config(tmp: Path, **kw) -> SandboxConfig:
    base = dict(backend="cpu", cache_dir=str(tmp / "cache"), work_root=str(tmp / "ws"), trial_timeout_s=3.0,
                load_timeout_s=60.0, reps=8, warmup_calls=1, min_rep_ms=1.0, bootstrap_samples=1000)
    base.update(kw)
    return SandboxConfig(**base)
