"""KernelBench metrics over evaluated samples: pass rate, faster-than-eager, faster-than-compile and geometric-mean
speed-ups, per level and overall. One function (`kernelbench_metrics`) serves `cuda-agent eval`, `cuda-agent sandbox
eval` over a folder of solutions, and the evaluations inside `cuda-agent train`, so every number is computed the
same way.

A sample is one evaluated solution of one task (`Sample`): whether it is correct (sandbox status "ok") and its
speed-ups (median eager / candidate and median torch.compile / candidate run time). Definitions (KernelBench,
Ouyang et al. 2025, "fast_p" at p = 1; CUDA Agent, arXiv 2602.24286, Section 5):

  pass_rate               correct samples / samples
  faster_than_eager       samples that are correct and have speed-up over eager > 1, / samples
  faster_than_compile     samples that are correct and have speed-up over torch.compile > 1, / samples
  geomean_speedup_eager   exp(mean(log s_eager)) over the correct samples (None when there are none)
  geomean_speedup_compile exp(mean(log s_compile)) over the correct samples with a torch.compile time
  mean_reward             mean milestone reward (-1 failed, 0 correct, 1 > eager, 2 > both, 3 >= 5% over both)
  pass_at_n               tasks with at least one correct sample / tasks (N = samples per task)

The rates count every sample in the denominator (a failed sample is a miss, never dropped). The geometric means
are over correct samples only, as the paper reports them; `geomean_speedup_compile_all` also gives the variant
that counts every failed sample as speed-up 1 (the user keeps the torch.compile baseline), which is comparable
across policies with different pass rates. Speed-ups here are point estimates (ratios of medians); whether a
milestone was *cleared* uses the sandbox's confidence intervals and shows in the reward.

Pure Python: no torch, no JAX.
"""

from __future__ import annotations

import dataclasses
import json
import math
import platform
from collections import defaultdict
from typing import Any, Iterable, Mapping, Sequence


@dataclasses.dataclass(frozen=True)
class Sample:
    """One evaluated solution.

    Fields:
      task_id: the task. level: KernelBench level (0 = unknown / not from KernelBench).
      correct: built, loaded and matched the reference on every trial (sandbox status "ok").
      speedup_eager: eager median / candidate median (None when not profiled).
      speedup_compile: torch.compile median / candidate median (None when not profiled or no compile baseline).
      reward: the milestone reward (-1 .. 3).
      status: the sandbox status (ok, compile_error, incorrect, ...) or an episode status when nothing was
        evaluated (e.g. "not_evaluated").
    """

    task_id: str
    level: int = 0
    correct: bool = False
    speedup_eager: float | None = None
    speedup_compile: float | None = None
    reward: float = -1.0
    status: str = ""

    def __post_init__(self) -> None:
        if not self.task_id:
            raise ValueError("Sample.task_id must be a non-empty string")
        for name in ("speedup_eager", "speedup_compile"):
            v = getattr(self, name)
            if v is not None and not (isinstance(v, (int, float)) and v > 0 and math.isfinite(v)):
                raise ValueError(f"Sample {self.task_id}: {name} must be a positive finite number or None, got {v!r}")


#: Status of a sample whose episode never wrote model_new.py.
NO_SOLUTION = "no_solution"


def sample_from_result_row(row: Mapping[str, Any]) -> Sample:
    """A Sample from an actor result row (`actors.episode.Episode.result_row`): the final evaluation's summary
    under "final" decides correctness and speed-ups. Raises ValueError when `task_id` is missing."""
    final = row.get("final") or {}
    status = str(final.get("status", row.get("status", "")))
    if "files" in row and "model_new.py" not in (row.get("files") or {}):
        status = NO_SOLUTION  # the episode ended without writing a solution (the sandbox calls that a build error)
    correct = status == "ok"
    return Sample(task_id=str(row.get("task_id", "")), level=int(row.get("level", 0) or 0), correct=correct,
                  speedup_eager=_pos(final.get("speedup_eager")) if correct else None,
                  speedup_compile=_pos(final.get("speedup_compile")) if correct else None,
                  reward=float(row.get("reward", final.get("reward", -1.0))), status=status)


def sample_from_eval_result(result: Any, level: int = 0) -> Sample:
    """A Sample from a `sandbox.result.EvalResult` (or its `to_dict()` map)."""
    d = result if isinstance(result, Mapping) else result.to_dict()
    timing = d.get("timing") or {}
    correct = d.get("status") == "ok"
    se = (timing.get("speedup_eager") or {}).get("point") if correct else None
    sc = (timing.get("speedup_compile") or {}).get("point") if correct else None
    return Sample(task_id=str(d.get("task_id", "")), level=int(level), correct=correct, speedup_eager=_pos(se),
                  speedup_compile=_pos(sc), reward=float(d.get("reward", -1.0)), status=str(d.get("status", "")))


def _pos(x: Any) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if v > 0 and math.isfinite(v) else None


def _geomean(values: Sequence[float]) -> float | None:
    if not values:
        return None
    return math.exp(sum(math.log(v) for v in values) / len(values))


def _group(samples: Sequence[Sample]) -> dict[str, Any]:
    n = len(samples)
    correct = [s for s in samples if s.correct]
    by_task: dict[str, list[Sample]] = defaultdict(list)
    for s in samples:
        by_task[s.task_id].append(s)
    se = [s.speedup_eager for s in correct if s.speedup_eager is not None]
    sc = [s.speedup_compile for s in correct if s.speedup_compile is not None]
    sc_all = [(s.speedup_compile if s.correct and s.speedup_compile is not None else 1.0) for s in samples]
    status_counts: dict[str, int] = defaultdict(int)
    for s in samples:
        status_counts[s.status or "unknown"] += 1
    return {
        "samples": n,
        "tasks": len(by_task),
        "samples_per_task": n / len(by_task) if by_task else 0.0,
        "pass_rate": len(correct) / n if n else 0.0,
        "faster_than_eager": sum(1 for s in correct if (s.speedup_eager or 0) > 1.0) / n if n else 0.0,
        "faster_than_compile": sum(1 for s in correct if (s.speedup_compile or 0) > 1.0) / n if n else 0.0,
        "geomean_speedup_eager": _geomean(se),
        "geomean_speedup_compile": _geomean(sc),
        "geomean_speedup_compile_all": _geomean(sc_all) if n else None,
        "mean_reward": sum(s.reward for s in samples) / n if n else None,
        "pass_at_n": sum(1 for v in by_task.values() if any(s.correct for s in v)) / len(by_task) if by_task else 0.0,
        "status_counts": dict(sorted(status_counts.items())),
    }


def kernelbench_metrics(samples: Iterable[Sample]) -> dict[str, Any]:
    """Metrics per level and overall (see the module doc for the definitions).

    Returns {"overall": {...}, "levels": {"1": {...}, ...}}; level keys are strings (JSON). Each group holds
    samples, tasks, samples_per_task, pass_rate, faster_than_eager, faster_than_compile, geomean_speedup_eager,
    geomean_speedup_compile, geomean_speedup_compile_all, mean_reward, pass_at_n, status_counts.
    Raises ValueError on an empty sample list.
    """
    samples = list(samples)
    if not samples:
        raise ValueError("kernelbench_metrics: no samples to score")
    levels: dict[int, list[Sample]] = defaultdict(list)
    for s in samples:
        levels[s.level].append(s)
    return {"overall": _group(samples), "levels": {str(k): _group(v) for k, v in sorted(levels.items())}}


def environment() -> dict[str, Any]:
    """Where the numbers were measured: GPU name (or "cpu"), torch version, CUDA version, host, Python."""
    info: dict[str, Any] = {"python": platform.python_version(), "machine": platform.machine(),
                            "host": platform.node()}
    try:
        import torch

        info["torch"] = torch.__version__
        info["cuda"] = torch.version.cuda
        info["device"] = (torch.cuda.get_device_name(0) if torch.cuda.is_available()
                          else f"cpu ({platform.processor() or platform.machine()})")
    except Exception as e:  # noqa: BLE001 - the report still says what is missing
        info["torch"] = f"unavailable ({type(e).__name__})"
        info["device"] = "unknown"
    return info


BUILT_STATUSES = ("ok", "incorrect", "runtime_error", "load_error", "timeout")
"""Sandbox statuses of a solution that got past the compiler (whatever happened next)."""


def episode_rates(rows: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Early-learning figures of agent episodes (actor result rows), for policies that do not pass yet:
    tool_call_rate (episodes with at least one well-formed tool call), solution_rate (the final workspace holds
    model_new.py) and build_rate (the final solution built: status in BUILT_STATUSES). Each a share of rows."""
    n = len(rows)
    if not n:
        return {"tool_call_rate": 0.0, "solution_rate": 0.0, "build_rate": 0.0}
    called = sum(1 for r in rows if any(t.get("tool") for t in (r.get("tools") or [])))
    wrote = sum(1 for r in rows if "model_new.py" in (r.get("files") or {}))
    built = sum(1 for r in rows if (r.get("final") or {}).get("status") in BUILT_STATUSES)
    return {"tool_call_rate": called / n, "solution_rate": wrote / n, "build_rate": built / n}


def _fmt(v: Any, pct: bool = False) -> str:
    if v is None:
        return "-"
    if pct:
        return f"{100 * v:.1f}%"
    if isinstance(v, float):
        return f"{v:.3f}"
    return str(v)


COLUMNS = (("samples", False), ("tasks", False), ("pass_rate", True), ("faster_than_eager", True),
           ("faster_than_compile", True), ("geomean_speedup_eager", False), ("geomean_speedup_compile", False),
           ("geomean_speedup_compile_all", False), ("mean_reward", False), ("pass_at_n", True))
_HEAD = ("samples", "tasks", "pass", ">eager", ">compile", "gm/eager", "gm/compile", "gm/compile*", "reward",
         "pass@N")
_LEGEND = ("pass: correct samples; >eager, >compile: correct and faster than eager / torch.compile (per sample); "
           "gm/eager, gm/compile: geometric-mean speed-up of the correct samples; gm/compile*: the same with every "
           "failed sample counted as 1x; reward: mean milestone reward; pass@N: tasks with a correct sample.")


def table_rows(metrics: Mapping[str, Any]) -> list[list[str]]:
    """[[group, cells...]] for each level then "all", formatted (percentages, 3 decimals)."""
    rows = []
    groups = [(f"level {k}" if k != "0" else "level ?", v) for k, v in metrics["levels"].items()]
    groups.append(("all", metrics["overall"]))
    for name, g in groups:
        rows.append([name] + [_fmt(g.get(k), pct) for k, pct in COLUMNS])
    return rows


def markdown_table(metrics: Mapping[str, Any], env: Mapping[str, Any] | None = None) -> str:
    """The metrics as a markdown table, with the device and torch version on a line above it."""
    lines = []
    if env:
        lines.append(f"Device: {env.get('device', '?')}; torch {env.get('torch', '?')}"
                     + (f" (CUDA {env['cuda']})" if env.get("cuda") else "") + "\n")
    lines.append("| group | " + " | ".join(_HEAD) + " |")
    lines.append("|" + " --- |" * (len(_HEAD) + 1))
    for r in table_rows(metrics):
        lines.append("| " + " | ".join(r) + " |")
    lines.append("\n" + _LEGEND)
    return "\n".join(lines) + "\n"


def rich_table(metrics: Mapping[str, Any], title: str = "KernelBench metrics", env: Mapping[str, Any] | None = None):
    """The metrics as a rich Table (for the console)."""
    from rich.table import Table

    caption = None
    if env:
        caption = f"{env.get('device', '?')}, torch {env.get('torch', '?')}"
    caption = _LEGEND if caption is None else f"{caption}. {_LEGEND}"
    t = Table(title=title, caption=caption, caption_justify="left")
    t.add_column("group")
    for h in _HEAD:
        t.add_column(h, justify="right")
    for r in table_rows(metrics):
        t.add_row(*r)
    return t


def write_report(metrics: Mapping[str, Any], env: Mapping[str, Any], json_path, md_path,
                 extra: Mapping | None = None) -> None:
    """Write the metrics as JSON ({"metrics", "environment", **extra}) and as a markdown table."""
    from pathlib import Path

    payload = {"metrics": metrics, "environment": dict(env), **(dict(extra) if extra else {})}
    Path(json_path).write_text(json.dumps(payload, indent=2, default=str) + "\n")
    Path(md_path).write_text("# KernelBench metrics\n\n" + markdown_table(metrics, env))
