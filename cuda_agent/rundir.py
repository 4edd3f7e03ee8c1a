"""The run folder of `cuda-agent train`, and the metrics log (JSONL + TensorBoard) every part of a run writes to.

Layout (paths relative to the run folder):

    config.yaml              the resolved TrainConfig (defaults < preset < overrides)
    state.json               progress for --resume: finished stages, the current policy checkpoint, counters
    metrics.jsonl            one JSON object per line (see `MetricsLog`)
    tb/                      TensorBoard event files (tensorboardX)
    logs/<process>.log       stdout + stderr of each child process (learner, actor-N, sandbox, eval-...)
    model/                   tokenizer.json and the initial model (Hugging Face layout: config.json, safetensors)
    policies/<tag>/          the policy after each stage (Hugging Face layout; what actors and evaluations load)
    learner/<stage>/         the learner's own folder per stage (Orbax checkpoints, spool, its metrics)
    episodes/<tag>.jsonl     per-episode result rows of evaluations (and of training rollouts where kept)
    trajectories/<tag>.md    a few sampled trajectories per stage, rendered for reading
    eval/<tag>.json          KernelBench metrics of each evaluation point
    kernels/                 the final files of the highest-reward episodes
    report.md, plots/*.png   the final report

`state.json` is rewritten atomically (write + rename), so a run killed at any point resumes from its last saved
state.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import threading
import time
from pathlib import Path
from typing import Any, Iterator, Mapping

SUBDIRS = ("tb", "logs", "model", "policies", "learner", "episodes", "trajectories", "eval", "kernels", "plots")


class RunDir:
    """Paths and small files of one run folder (created on construction)."""

    def __init__(self, root: str | Path):
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        for d in SUBDIRS:
            (self.root / d).mkdir(exist_ok=True)

    def __truediv__(self, other: str) -> Path:
        return self.root / other

    @property
    def config_path(self) -> Path:
        return self.root / "config.yaml"

    @property
    def state_path(self) -> Path:
        return self.root / "state.json"

    @property
    def metrics_path(self) -> Path:
        return self.root / "metrics.jsonl"

    def log_dir(self) -> Path:
        return self.root / "logs"

    def policy_dir(self, tag: str) -> Path:
        return self.root / "policies" / tag

    def learner_dir(self, stage: str) -> Path:
        return self.root / "learner" / stage

    def episodes_path(self, tag: str) -> Path:
        return self.root / "episodes" / f"{tag}.jsonl"

    def eval_path(self, tag: str) -> Path:
        return self.root / "eval" / f"{tag}.json"

    # ---------------------------------------------------------------------------------------------- state
    def read_state(self) -> dict[str, Any]:
        """The saved progress ({} for a new run). Raises ValueError naming the file when it is not JSON."""
        if not self.state_path.exists():
            return {}
        try:
            return json.loads(self.state_path.read_text())
        except ValueError as e:
            raise ValueError(f"{self.state_path}: not valid JSON ({e})") from None

    def write_state(self, state: Mapping[str, Any]) -> None:
        tmp = self.state_path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(state, indent=2, default=str) + "\n")
        os.replace(tmp, self.state_path)


def _number(v: Any) -> float | None:
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, (int, float)) and math.isfinite(v):
        return float(v)
    return None


class MetricsLog:
    """Append-only metrics: JSONL (every record) and TensorBoard (every numeric field as a scalar).

    A record is {"time": unix s, "elapsed_s": s since the log was opened (continued on resume), "kind":
    "train" | "eval" | "event" | "stage" | "rollout", "stage": stage name, "step": global step, **fields}.
    TensorBoard tags are "<kind>/<field>" for fields without a namespace and the field name itself for namespaced
    keys ("ppo/clip_frac"), at the record's step. Thread-safe.
    """

    def __init__(self, path: str | Path, tb_dir: str | Path | None = None, elapsed_offset_s: float = 0.0):
        self.path = Path(path)
        self._f = open(self.path, "a", buffering=1)
        self._lock = threading.Lock()
        self._t0 = time.time() - elapsed_offset_s
        self._tb = None
        if tb_dir is not None:
            from tensorboardX import SummaryWriter

            self._tb = SummaryWriter(str(tb_dir), flush_secs=10)

    @property
    def elapsed_s(self) -> float:
        return time.time() - self._t0

    def log(self, kind: str, stage: str, step: int, **fields: Any) -> dict[str, Any]:
        rec = {"time": time.time(), "elapsed_s": round(self.elapsed_s, 3), "kind": kind, "stage": stage,
               "step": int(step), **fields}
        line = json.dumps(rec, default=_json_default)
        with self._lock:
            self._f.write(line + "\n")
            if self._tb is not None:
                for k, v in fields.items():
                    x = _number(v)
                    if x is None:
                        continue
                    tag = k if "/" in k else f"{kind}/{k}"
                    self._tb.add_scalar(tag, x, int(step), walltime=rec["time"])
        return rec

    def close(self) -> None:
        with self._lock:
            if not self._f.closed:
                self._f.close()
            if self._tb is not None:
                self._tb.close()
                self._tb = None


def _json_default(o: Any) -> Any:
    if dataclasses.is_dataclass(o):
        return dataclasses.asdict(o)
    try:
        import numpy as np

        if isinstance(o, np.generic):
            return o.item()
        if isinstance(o, np.ndarray):
            return o.tolist()
    except ImportError:  # pragma: no cover
        pass
    return str(o)


def read_metrics(path: str | Path) -> Iterator[dict[str, Any]]:
    """Records of a metrics JSONL file, skipping a torn last line (a run killed mid-write)."""
    p = Path(path)
    if not p.exists():
        return
    with open(p) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                yield json.loads(line)
            except ValueError:
                continue
