"""Learner metrics to JSONL and TensorBoard (tensorboardX event files, no TensorFlow needed).

One line per logged step in `<dir>/metrics.jsonl`: {"step": int, "time": unix seconds, "<key>": value, ...}
with namespaced, stable keys (`ppo/clip_frac`, `critic/value_loss`, `reward/mean`, `learner/policy_lag_mean`,
...). Non-finite floats are written as null. The same scalars go to TensorBoard under their key, and
distributions (e.g. the batch's final rewards, policy lags) as histograms. In a multi-host learner only
process 0 writes.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any, Mapping

import numpy as np


def _plain(v: Any) -> Any:
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if isinstance(v, (int, np.integer)):
        return int(v)
    try:
        f = float(v)
    except (TypeError, ValueError):
        return str(v)
    return f if math.isfinite(f) else None


class MetricsLogger:
    """Writes metrics of the learner.

    Args:
      directory: output folder (created).
      tensorboard: also write TensorBoard event files.
      enabled: False makes every call a no-op (non-zero processes of a multi-host learner).
    """

    def __init__(self, directory: str | Path, tensorboard: bool = True, enabled: bool = True):
        self.enabled = enabled
        self.directory = Path(directory)
        self._jsonl = None
        self._tb = None
        if not enabled:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        self._jsonl = open(self.directory / "metrics.jsonl", "a", buffering=1)
        if tensorboard:
            from tensorboardX import SummaryWriter

            self._tb = SummaryWriter(logdir=str(self.directory / "tensorboard"))

    def log(self, step: int, metrics: Mapping[str, Any], histograms: Mapping[str, np.ndarray] | None = None) -> None:
        """Record scalar `metrics` (and optional `histograms`: name -> values) at `step`."""
        if not self.enabled:
            return
        row = {"step": int(step), "time": time.time()}
        row.update({k: _plain(v) for k, v in metrics.items()})
        self._jsonl.write(json.dumps(row) + "\n")
        if self._tb is not None:
            for k, v in row.items():
                if k in ("step", "time") or not isinstance(v, (int, float)) or isinstance(v, bool):
                    continue
                self._tb.add_scalar(k, v, global_step=int(step))
            for k, values in (histograms or {}).items():
                arr = np.asarray(values, np.float64).ravel()
                if arr.size:
                    self._tb.add_histogram(k, arr, global_step=int(step))

    def flush(self) -> None:
        if self._jsonl is not None:
            self._jsonl.flush()
        if self._tb is not None:
            self._tb.flush()

    def close(self) -> None:
        if self._jsonl is not None:
            self._jsonl.close()
            self._jsonl = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None

    def __enter__(self) -> "MetricsLogger":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def read_jsonl(path: str | Path) -> list[dict]:
    """The rows of a metrics.jsonl file."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
