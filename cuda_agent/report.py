"""The run report: `report.md` with PNG plots of reward, pass rate and speed-up over time, the evaluation after each
stage, a per-task table, and the final kernels of the highest-reward episodes, built from the run folder alone
(metrics.jsonl, eval/*.json, episodes/*.jsonl), so `cuda-agent train --resume` or a person can rebuild it anytime:

    python -m cuda_agent.report RUN_DIR

Records read from metrics.jsonl (see cuda_agent.rundir.MetricsLog):
  kind "eval":    one evaluation point: tag, split ("eval", "train" or "rollout"), and the KernelBench metrics of
                  cuda_agent.kb_metrics (pass_rate, mean_reward, faster_than_eager, geomean_speedup_eager, ...)
  kind "rollout": one batch of training episodes: reward_mean, pass_rate, episodes_per_s, speedup_eager_geomean
  kind "stage":   a stage's start / end (event "start" | "end" | "skipped" | "not_wired"), with its duration
  kind "train":   learner metrics (sft/nll, ppo/..., critic/...)
  kind "event":   child process events (restarts)
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable, Mapping

from cuda_agent.rundir import read_metrics

_STAGE_COLORS = ("#f2f2f2", "#e6f0fa")


_SPLIT_LABELS = {"eval": "held-out eval split", "train": "training tasks", "rollout": "PPO rollout tasks"}


def _f(v: Any, digits: int = 3) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def _pct(v: Any) -> str:
    return "-" if v is None else f"{100 * float(v):.1f}%"


def load_records(run_dir: Path) -> list[dict[str, Any]]:
    return list(read_metrics(Path(run_dir) / "metrics.jsonl"))


def _stage_spans(records: list[dict]) -> list[tuple[str, float, float]]:
    """(stage, start elapsed_s, end elapsed_s) of each stage that started."""
    spans = []
    open_: dict[str, float] = {}
    for r in records:
        if r.get("kind") != "stage":
            continue
        if r.get("event") == "start":
            open_[r["stage"]] = r["elapsed_s"]
        elif r.get("event") == "end" and r["stage"] in open_:
            spans.append((r["stage"], open_.pop(r["stage"]), r["elapsed_s"]))
    end = max((r["elapsed_s"] for r in records), default=0.0)
    for s, t0 in open_.items():
        spans.append((s, t0, end))
    return sorted(spans, key=lambda x: x[1])


def plot_series(records: list[dict], out_dir: Path) -> dict[str, Path]:
    """Write reward.png, pass_rate.png and speedup.png (over elapsed minutes, stages shaded); returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    spans = _stage_spans(records)
    rollouts = [r for r in records if r.get("kind") == "rollout"]
    evals = [r for r in records if r.get("kind") == "eval"]
    panels = {
        "reward": ("mean milestone reward", "reward_mean", "mean_reward", (-1.1, 3.1)),
        "pass_rate": ("pass rate (correct solutions)", "pass_rate", "pass_rate", (-0.02, 1.02)),
        "speedup": ("geometric-mean speed-up of correct solutions", "speedup_eager_geomean", "geomean_speedup_eager",
                    None),
    }
    paths = {}
    for name, (title, roll_key, eval_key, ylim) in panels.items():
        fig, ax = plt.subplots(figsize=(8, 4), dpi=100)
        for i, (stage, t0, t1) in enumerate(spans):
            ax.axvspan(t0 / 60, t1 / 60, color=_STAGE_COLORS[i % 2], zorder=0)
            ax.text((t0 + t1) / 120, 1.0 + 0.045 * (i % 2), stage.replace("_", " "), transform=ax.get_xaxis_transform(),
                    ha="center", va="bottom", fontsize=7)  # alternate heights: short stages sit side by side
        xs = [r["elapsed_s"] / 60 for r in rollouts if r.get(roll_key) is not None]
        ys = [r[roll_key] for r in rollouts if r.get(roll_key) is not None]
        if xs:
            ax.plot(xs, ys, ".-", color="tab:blue", label="training episodes", alpha=0.8)
        for split, color, marker in (("eval", "tab:red", "o"), ("train", "tab:green", "s"),
                                     ("rollout", "tab:olive", "D")):
            pts = [(r["elapsed_s"] / 60, r.get(eval_key)) for r in evals if r.get("split", "eval") == split
                   and r.get(eval_key) is not None]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker + "--", color=color,
                        label=f"evaluation ({_SPLIT_LABELS[split]})")
        if name == "pass_rate":
            for key, color, label in (("solution_rate", "tab:orange", "wrote model_new.py"),
                                      ("build_rate", "tab:brown", "solution built")):
                pts = [(r["elapsed_s"] / 60, r.get(key)) for r in evals if r.get("split", "eval") == "eval"
                       and r.get(key) is not None]
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], "x:", color=color,
                            label=f"evaluation, {label}")
        if name == "speedup":
            pts = [(r["elapsed_s"] / 60, r.get("geomean_speedup_compile")) for r in evals
                   if r.get("split", "eval") == "eval" and r.get("geomean_speedup_compile") is not None]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], "^:", color="tab:purple",
                        label="evaluation, vs torch.compile")
            ax.axhline(1.0, color="grey", lw=0.8, ls=":")
        if ylim:
            ax.set_ylim(*ylim)
        ax.set_xlabel("elapsed time (min)")
        ax.set_title(title, fontsize=10, pad=22)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="lower right")
        else:
            ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center", color="grey")
        ax.grid(alpha=0.3)
        fig.tight_layout()
        p = out_dir / f"{name}.png"
        fig.savefig(p)
        plt.close(fig)
        paths[name] = p
    return paths


def plot_losses(records: list[dict], out_dir: Path) -> Path:
    """loss.png: what the networks learn step by step: supervised NLL and token accuracy (warm start, RFT) and
    the critic's value loss (value pre-training, PPO), over elapsed minutes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.6), dpi=100)
    train = [r for r in records if r.get("kind") == "train"]
    for stage, color in (("warm_start", "tab:blue"), ("rft", "tab:green")):
        pts = [(r["elapsed_s"] / 60, r["sft/nll"], r.get("sft/accuracy")) for r in train
               if r["stage"] == stage and isinstance(r.get("sft/nll"), (int, float))]
        if pts:
            a1.plot([p[0] for p in pts], [p[1] for p in pts], ".-", color=color, label=f"{stage}: NLL (nats/token)")
            acc = [(p[0], p[2]) for p in pts if isinstance(p[2], (int, float))]
            if acc:
                a1.plot([p[0] for p in acc], [p[1] for p in acc], "x:", color=color, label=f"{stage}: token accuracy")
    for stage, color in (("value_pretrain", "tab:purple"), ("single_turn_ppo", "tab:orange"),
                         ("multi_turn_ppo", "tab:red")):
        pts = [(r["elapsed_s"] / 60, r["critic/value_loss"]) for r in train
               if r["stage"] == stage and isinstance(r.get("critic/value_loss"), (int, float))]
        if pts:
            a2.plot([p[0] for p in pts], [p[1] for p in pts], ".-", color=color, label=stage)
    a1.set_title("supervised stages", fontsize=10)
    a2.set_title("critic value loss", fontsize=10)
    for ax in (a1, a2):
        ax.set_xlabel("elapsed time (min)")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center", color="grey")
    fig.tight_layout()
    out_dir.mkdir(parents=True, exist_ok=True)
    p = out_dir / "loss.png"
    fig.savefig(p)
    plt.close(fig)
    return p


def _eval_points(run_dir: Path) -> list[dict[str, Any]]:
    """Each eval/<tag>.json (written by the train driver), in the order they were made."""
    out = []
    for p in sorted((run_dir / "eval").glob("*.json")):
        try:
            d = json.loads(p.read_text())
        except ValueError:
            continue
        d.setdefault("tag", p.stem)
        out.append(d)
    return sorted(out, key=lambda d: (d.get("order", 0), d.get("elapsed_s", 0.0)))


def _episode_rows(run_dir: Path) -> Iterable[tuple[str, dict]]:
    for p in sorted((run_dir / "episodes").glob("*.jsonl")):
        with open(p) as f:
            for line in f:
                try:
                    yield p.stem, json.loads(line)
                except ValueError:
                    continue


def _speedup(row: Mapping) -> float:
    v = (row.get("final") or {}).get("speedup_eager")
    return float(v) if isinstance(v, (int, float)) else 0.0


def best_kernels(run_dir: Path, k: int) -> list[tuple[str, dict]]:
    """The k highest-reward episodes with files (ties: higher speed-up over eager), one per task."""
    best: dict[str, tuple[str, dict]] = {}
    for tag, row in _episode_rows(run_dir):
        if not row.get("files") or row.get("reward") is None:
            continue
        key = (float(row["reward"]), _speedup(row))
        cur = best.get(row["task_id"])
        if cur is None or key > (float(cur[1]["reward"]), _speedup(cur[1])):
            best[row["task_id"]] = (tag, row)
    ranked = sorted(best.values(), key=lambda x: (float(x[1]["reward"]), _speedup(x[1])), reverse=True)
    return ranked[:k]


def _per_task_table(points: list[dict], split: str = "eval") -> list[str]:
    pts = [p for p in points if p.get("split", "eval") == split and p.get("per_task")]
    if not pts:
        return ["(no per-task results)"]
    tasks = sorted({t for p in pts for t in p["per_task"]})
    head = "| task | " + " | ".join(p["tag"] for p in pts) + " | best speed-up vs eager |"
    lines = [head, "|" + " --- |" * (len(pts) + 2)]
    for t in tasks:
        cells = []
        best = None
        for p in pts:
            r = p["per_task"].get(t)
            if r is None:
                cells.append("-")
                continue
            cells.append(f"{r['reward']:+.1f} ({r['status']})")
            s = r.get("speedup_eager")
            if s is not None and (best is None or s > best):
                best = s
        lines.append(f"| {t} | " + " | ".join(cells) + f" | {_f(best, 2)} |")
    return lines


def _loss_span(records: list[dict], stage: str) -> str:
    """First and last value of the stage's main loss (SFT NLL, else the critic's value loss)."""
    for key, label in (("sft/nll", "NLL"), ("critic/value_loss", "value loss")):
        vals = [r[key] for r in records if r.get("kind") == "train" and r.get("stage") == stage
                and isinstance(r.get(key), (int, float))]
        if vals:
            return f"{label} {vals[0]:.3f} -> {vals[-1]:.3f}"
    return "-"


def build_report(run_dir: str | Path) -> Path:
    """Write report.md and plots/*.png for a run folder; returns the report's path."""
    from cuda_agent.kb_metrics import markdown_table

    run_dir = Path(run_dir)
    records = load_records(run_dir)
    plots = plot_series(records, run_dir / "plots")
    plots["loss"] = plot_losses(records, run_dir / "plots")
    points = _eval_points(run_dir)
    state = {}
    if (run_dir / "state.json").exists():
        try:
            state = json.loads((run_dir / "state.json").read_text())
        except ValueError:
            state = {}
    lines = [f"# cuda-agent training report: {run_dir.name}", ""]
    env = state.get("environment", {})
    lines.append(f"- preset: `{state.get('preset', '?')}`; device: {env.get('device', '?')}; torch "
                 f"{env.get('torch', '?')}; run status: **{state.get('status', '?')}**")
    total = max((r["elapsed_s"] for r in records), default=0.0)
    lines.append(f"- elapsed: {total / 60:.1f} min; config: `config.yaml`; metrics: `metrics.jsonl`, "
                 "TensorBoard: `tb/`")
    lines.append("")

    # stages
    lines += ["## Stages", "", "| stage | status | duration | loss first -> last | notes |",
              "| --- | --- | --- | --- | --- |"]
    for name, info in state.get("stages", {}).items():
        lines.append(f"| {name} | {info.get('status', '-')} | {_f(info.get('duration_s'), 0)} s | "
                     f"{_loss_span(records, name)} | {info.get('note', '')} |")
    lines.append("")

    # learning on the eval split
    lines += ["## Evaluation on the held-out split after each stage", "",
              "Mean milestone reward (-1 failed, 0 correct, 1 faster than eager, 2 faster than torch.compile too, "
              "3 at least 5% faster than both) and pass rate on the fixed evaluation split, whose tasks have no "
              "demonstrations (split \"eval\"; \"train\": a probe of training tasks with demonstrations; "
              "\"rollout\": the tasks the PPO stages sample, where the reward is learned).", "",
              "Before a small model passes at all, three earlier figures show what it has learned: the share of "
              "episodes with a well-formed tool call, whose workspace holds a model_new.py, and whose solution "
              "built. A model trained from scratch for minutes (the smoke preset) is expected to score -1 "
              "everywhere; see benchmarks/RESULTS.md for what the default preset reaches.", "",
              "\"after step\": the run's cumulative training steps when the evaluated policy was saved (optimiser "
              "steps of the supervised stages 0, 2 and 3 plus PPO updates of stages 1 and 4).", "",
              "| point | split | after step | samples | mean reward | pass rate | > eager | > compile | "
              "geomean vs eager | tool call | wrote model_new.py | built |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for p in points:
        m = p.get("metrics", {}).get("overall", {})
        er = p.get("episode_rates", {})
        lines.append(f"| {p['tag']} | {p.get('split', 'eval')} | {p.get('updates', '-')} | {m.get('samples', '-')} | "
                     f"{_f(m.get('mean_reward'))} | {_pct(m.get('pass_rate'))} | {_pct(m.get('faster_than_eager'))} | "
                     f"{_pct(m.get('faster_than_compile'))} | {_f(m.get('geomean_speedup_eager'))} | "
                     f"{_pct(er.get('tool_call_rate'))} | {_pct(er.get('solution_rate'))} | "
                     f"{_pct(er.get('build_rate'))} |")
    if not points:
        lines.append("| (no evaluation ran) | | | | | | | | | | | |")
    lines.append("")
    last_eval = [p for p in points if p.get("split", "eval") == "eval" and p.get("metrics")]
    if last_eval:
        lines += [f"KernelBench metrics of the last evaluation ({last_eval[-1]['tag']}):", "",
                  markdown_table(last_eval[-1]["metrics"], last_eval[-1].get("environment") or env), ""]

    # plots
    lines += ["## Over time", ""]
    for name, p in plots.items():
        lines.append(f"![{name}](plots/{p.name})")
    lines.append("")

    # training throughput summary
    rollouts = [r for r in records if r.get("kind") == "rollout"]
    if rollouts:
        by_stage: dict[str, list[dict]] = defaultdict(list)
        for r in rollouts:
            by_stage[r["stage"]].append(r)
        lines += ["## Training episodes", "", "| stage | batches | episodes | mean reward | pass rate | episodes/s |",
                  "| --- | --- | --- | --- | --- | --- |"]
        for s, rs in by_stage.items():
            n = sum(r.get("episodes", 0) for r in rs)
            rw = [r["reward_mean"] for r in rs if r.get("reward_mean") is not None]
            pr = [r["pass_rate"] for r in rs if r.get("pass_rate") is not None]
            eps = [r["episodes_per_s"] for r in rs if r.get("episodes_per_s") is not None]
            lines.append(f"| {s} | {len(rs)} | {n} | {_f(sum(rw) / len(rw) if rw else None)} | "
                         f"{_pct(sum(pr) / len(pr) if pr else None)} | {_f(sum(eps) / len(eps) if eps else None)} |")
        lines.append("")

    events = [r for r in records if r.get("kind") == "event" and r.get("state") in ("crashed", "restarting", "failed")]
    if events:
        lines += ["## Process events", ""]
        for e in events[:50]:
            lines.append(f"- {e['elapsed_s']:.0f} s: {e.get('name')} {e.get('state')} {e.get('message', '')}")
        lines.append("")

    lines += ["## Per task (held-out evaluation split)", "", "Reward (sandbox status) at each evaluation point.", ""]
    lines += _per_task_table(points, "eval")
    lines.append("")
    if any(p.get("split") == "rollout" for p in points):
        lines += ["## Per task (the PPO stages' rollout tasks)", "",
                  "The tasks the PPO stages sample (RUN/tasks/rollout.jsonl; with tasks.rollout_composed, fresh "
                  "compositions with no demonstrations): what the reward teaches on the tasks it comes from.", ""]
        lines += _per_task_table(points, "rollout")
        lines.append("")

    # kernels
    k = int(state.get("top_kernels", 5))
    top = best_kernels(run_dir, k)
    lines += ["## Final kernels of the highest-reward episodes", ""]
    if not top:
        lines.append("(no episode kept files)")
    kdir = run_dir / "kernels"
    for i, (tag, row) in enumerate(top):
        folder = kdir / f"{i + 1:02d}-{row['task_id']}"
        folder.mkdir(parents=True, exist_ok=True)
        for rel, text in row["files"].items():
            dst = folder / rel
            if dst.resolve().is_relative_to(folder.resolve()):
                dst.parent.mkdir(parents=True, exist_ok=True)
                dst.write_text(text)
        fin = row.get("final") or {}
        lines.append(f"### {i + 1}. {row['task_id']}: reward {row['reward']:+g} "
                     f"({fin.get('status', row.get('status'))}),"
                     f" speed-up vs eager {_f(fin.get('speedup_eager'), 2)}, vs torch.compile "
                     f"{_f(fin.get('speedup_compile'), 2)} ({tag})")
        lines.append("")
        lines.append(f"Files in `kernels/{folder.name}/`.")
        for rel, text in sorted(row["files"].items()):
            lang = "python" if rel.endswith(".py") else ("cuda" if rel.endswith((".cu", ".cuh")) else "cpp")
            body = text if len(text) <= 4000 else text[:4000] + "\n... (truncated; full file in the folder)"
            lines += ["", f"`{rel}`:", f"```{lang}", body.rstrip(), "```"]
        lines.append("")
    out = run_dir / "report.md"
    out.write_text("\n".join(lines) + "\n")
    return out


def main() -> None:  # pragma: no cover - thin CLI
    import sys

    if len(sys.argv) != 2:
        print("usage: python -m cuda_agent.report RUN_DIR", file=sys.stderr)
        raise SystemExit(2)
    print(build_report(sys.argv[1]))


if __name__ == "__main__":  # pragma: no cover
    main()
