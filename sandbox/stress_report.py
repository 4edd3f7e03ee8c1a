"""Reports of the fleet stress test: markdown for people, PNG (matplotlib) for the shape, JSON for machines.

`write_reports(report, out_dir)` writes `stress.md`, `stress.png` and `stress.json` and returns their paths.
`report` is `{"kind": "run" | "sweep", "config": {...}, "run": <run summary>}` or `{..., "sweep": <sweep>}` as
built by `sandbox.stress`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


def _f(x: Any, fmt: str = ".3g") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    return format(x, fmt)


def _pct(x: Any) -> str:
    return "n/a" if x is None else f"{x:.0%}"


def _run_lines(run: dict[str, Any]) -> list[str]:
    lat = run["latency_ms"]
    lines = [
        f"- jobs: {run['jobs_sent']} sent, {run['results']} results, errors {run['errors'] or 'none'}, "
        f"busy replies {run['busy_replies']}, resends {run['resends']}",
        f"- throughput: {_f(run['throughput_per_s'])} evaluations/s = **{_f(run['evaluations_per_hour'], ',.0f')} "
        f"evaluations/hour** over {_f(run['window_s'], '.1f')} s",
        f"- end-to-end latency (ms): p50 {_f(lat.get('p50_ms'), '.0f')}, p95 {_f(lat.get('p95_ms'), '.0f')}, "
        f"p99 {_f(lat.get('p99_ms'), '.0f')}, max {_f(lat.get('max_ms'), '.0f')}"
        + (" (from the intended send time)" if run["mode"] == "rate" else ""),
        f"- worker restarts {run['nodes'].get('worker_restarts', 0)}, worker busy "
        f"{_pct(run['nodes'].get('worker_busy_fraction'))}, GPU busy {_pct(run['nodes'].get('gpu_busy_fraction'))}, "
        f"results flagged contended {run['contended']}",
    ]
    lt = run["little"]
    lines.append(f"- Little's law: mean jobs in flight {_f(lt['mean_in_flight'])} vs throughput x mean latency "
                 f"{_f(lt['throughput_x_latency'])} (ratio {_f(lt['ratio'])}; about 1 when the measurement is "
                 "consistent)")
    lines += ["", "| stage | count | p50 ms | p95 ms | p99 ms | max ms |", "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for s, p in run["stage_ms"].items():
        name = "queueing delay" if s == "queue" else s
        lines.append(f"| {name} | {p['count']} | {_f(p['p50_ms'], '.0f')} | {_f(p['p95_ms'], '.0f')} | "
                     f"{_f(p['p99_ms'], '.0f')} | {_f(p['max_ms'], '.0f')} |")
    statuses = sorted({s for v in run["status_by_kind"].values() for s in v})
    lines += ["", "| kind | " + " | ".join(statuses) + " |", "| --- |" + " ---: |" * len(statuses)]
    for kind, counts in run["status_by_kind"].items():
        lines.append(f"| {kind} | " + " | ".join(str(counts.get(s, 0)) for s in statuses) + " |")
    return lines


def markdown(report: dict[str, Any]) -> str:
    cfg = report.get("config", {})
    lines = ["# Sandbox fleet stress test", "",
             f"- date: {report.get('date', '')}; nodes: {', '.join(report.get('endpoints', []))}",
             f"- load: {cfg.get('load', {})}", f"- corpus: {report.get('corpus', {})}", ""]
    if report["kind"] == "sweep":
        sw = report["sweep"]
        lines += [f"**Knee: {_f(sw['knee_rate_per_s'])} jobs/s offered**; broken from "
                  f"{_f(sw['broken_at_rate_per_s'])} jobs/s; throughput at saturation "
                  f"{_f(sw['saturation_throughput_per_s'])} evaluations/s "
                  f"({_f(sw['saturation_throughput_per_s'] * 3600, ',.0f')} per hour)", "",
                  "| offered /s | throughput /s | p50 ms | p95 ms | p99 ms | queue p99 ms | errors | busy | "
                  "worker busy | GPU busy | Little ratio | broken |",
                  "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
        for st in sw["steps"]:
            lat, q = st["latency_ms"], st["stage_ms"].get("queue", {})
            lines.append(
                f"| {_f(st['offered_rate_per_s'])} | {_f(st['throughput_per_s'])} | {_f(lat.get('p50_ms'), '.0f')} | "
                f"{_f(lat.get('p95_ms'), '.0f')} | {_f(lat.get('p99_ms'), '.0f')} | {_f(q.get('p99_ms'), '.0f')} | "
                f"{sum(st['errors'].values())} | {st['busy_replies']} | "
                f"{_pct(st['nodes'].get('worker_busy_fraction'))} | {_pct(st['nodes'].get('gpu_busy_fraction'))} | "
                f"{_f(st['little']['ratio'])} | {'; '.join(st['broken']) or ''} |")
        for st in sw["steps"]:
            lines += ["", f"## step {st['label']}: {_f(st['offered_rate_per_s'])} jobs/s offered", ""]
            lines += _run_lines(st)
    else:
        lines += _run_lines(report["run"])
    return "\n".join(lines) + "\n"


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    if report["kind"] == "sweep":
        steps = report["sweep"]["steps"]
        x = [s["offered_rate_per_s"] for s in steps]
        for q, style in (("p50_ms", "o-"), ("p95_ms", "s--"), ("p99_ms", "^-")):
            ax.plot(x, [s["latency_ms"].get(q, float("nan")) / 1e3 for s in steps], style, label=q.split("_")[0])
        ax.set_xlabel("offered load (jobs/s)")
        ax.set_ylabel("end-to-end latency (s, from intended send time)")
        ax.set_yscale("log")
        ax2 = ax.twinx()
        ax2.plot(x, [s["throughput_per_s"] for s in steps], "k:", label="throughput")
        ax2.set_ylabel("throughput (evaluations/s)")
        knee = report["sweep"]["knee_rate_per_s"]
        if knee:
            ax.axvline(knee, color="grey", alpha=0.5)
            ax.annotate("knee", (knee, ax.get_ylim()[1]), ha="center", va="top")
        ax.legend(loc="upper left")
        ax2.legend(loc="lower right")
        ax.set_title("Sandbox fleet: latency against offered load")
    else:
        recs = [r for r in report["run"]["records"] if r["done_s"] >= 0]
        kinds = sorted({r["kind"] for r in recs})
        for k in kinds:
            rs = [r for r in recs if r["kind"] == k]
            ax.scatter([r["intended_s"] for r in rs], [r["latency_ms"] / 1e3 for r in rs], s=12, label=k)
        ax.set_xlabel("intended send time (s from start)")
        ax.set_ylabel("end-to-end latency (s)")
        ax.legend()
        ax.set_title(f"Sandbox fleet: {report['run']['mode']} run")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_reports(report: dict[str, Any], out_dir: str | Path) -> dict[str, Path]:
    """Write stress.md, stress.png and stress.json under `out_dir`; returns {"markdown", "png", "json"}."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"markdown": out / "stress.md", "png": out / "stress.png", "json": out / "stress.json"}
    paths["markdown"].write_text(markdown(report))
    plot(report, paths["png"])
    paths["json"].write_text(json.dumps(report, indent=1, default=str))
    return paths
