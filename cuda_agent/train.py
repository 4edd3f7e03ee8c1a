"""`cuda-agent train`: the whole pipeline on one machine, as separate processes on loopback.

    cuda-agent train                          # the `local` preset: <= 20 min on a 2-core CPU machine
    cuda-agent train --preset smoke           # CI: a few minutes
    cuda-agent train --preset h200 model.hf_path=/models/policy
    cuda-agent train stages.warm_start.steps=400 eval.every_updates=2
    cuda-agent train --resume runs/20260101-120000-local

What runs (each a child process under cuda_agent.supervisor; logs in RUN/logs/):
  sandbox     `cuda-agent sandbox serve`: the node that builds, verifies, profiles and rewards (CPU backend here,
              CUDA where a GPU is), up for the whole run so its torch.compile baselines stay cached; its inductor
              cache lives in ~/.cache/cuda-agent and carries over to later runs. Restarted if it dies.
  per stage   0 warm_start, 2 rft, 3 value_pretrain: the offline learner process (cuda_agent.stage_worker);
              1 single_turn_ppo, 4 multi_turn_ppo: the learner service plus `actors` actor processes
              (restarted if they die) that sample episodes and run them against the sandbox node.
  eval        `cuda-agent eval` on the fixed evaluation split after stage 0, after each later stage that changes
              the policy, and every `eval.every_updates` PPO updates.

The driver (this process) prepares the tokenizer and the initial model, runs the stages in order, mirrors every
child's metrics into RUN/metrics.jsonl and TensorBoard, shows a progress bar per stage (reward, pass rate,
episodes/s), keeps state.json current for --resume, and writes report.md at the end (and on Ctrl-C).

Ctrl-C or SIGTERM: the running stage's learner gets SIGTERM and writes its checkpoint, the actors and the
sandbox node stop, the report is written, and the exit status is 130; `--resume RUN_DIR` continues from the
interrupted stage's checkpoint. A second Ctrl-C kills everything at once.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, List, Optional

import typer
from rich.console import Console

from cuda_agent.rundir import MetricsLog, RunDir
from cuda_agent.train_config import STAGE_NAMES, TrainConfig

log = logging.getLogger("cuda_agent.train")
console = Console(stderr=True)

PRESETS_DIR = Path(__file__).resolve().parent.parent / "configs"
OFFLINE_STAGES = ("warm_start", "rft", "value_pretrain")
PPO_STAGES = ("single_turn_ppo", "multi_turn_ppo")


# evaluation splits -> their task file in RUN/tasks (written by Trainer._prepare)
_SPLIT_FILES = {"eval": "eval.jsonl", "train": "train_probe.jsonl", "rollout": "rollout.jsonl"}

class Interrupted(Exception):
    """The user asked the run to stop (Ctrl-C / SIGTERM)."""


class JsonlTail:
    """New records of a JSONL file that another process appends to (a torn last line waits for its end)."""

    def __init__(self, path: Path, from_end: bool = False):
        """from_end: skip what the file already holds (a resumed stage: those records were mirrored before)."""
        self.path = path
        self.offset = path.stat().st_size if from_end and path.exists() else 0
        self.buf = b""

    def read(self) -> list[dict]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        self.offset += len(data)
        self.buf += data
        *lines, self.buf = self.buf.split(b"\n")
        out = []
        for ln in lines:
            try:
                out.append(json.loads(ln))
            except ValueError:
                continue
        return out


def resolve_device(device: str) -> str:
    if device != "auto":
        return device
    from sandbox.evaluator import resolve_backend

    return resolve_backend("auto")


#: YAML files in configs/ that configure one component, not `cuda-agent train`.
OTHER_PRESETS = ("learner",)


def preset_path(name: str) -> Path:
    """configs/<name>.yaml. Raises typer.BadParameter listing the presets when it does not exist."""
    known = sorted(x.stem for x in PRESETS_DIR.glob("*.yaml") if x.stem not in OTHER_PRESETS)
    p = PRESETS_DIR / f"{name}.yaml"
    if name in OTHER_PRESETS or not p.exists():
        raise typer.BadParameter(f"unknown preset {name!r}; presets: {', '.join(known)}", param_hint="--preset")
    return p


class TrainDriver:
    """Runs one training run (see the module doc). `run()` returns the process exit status."""

    def __init__(self, cfg: TrainConfig, run: RunDir, quiet: bool = False):
        self.cfg = cfg
        self.run_dir = run
        self.quiet = quiet
        self.device = resolve_device(cfg.device)
        self.fmt = cfg.tasks.format if cfg.tasks.format != "auto" else ("cubin" if self.device == "cuda" else "cpu")
        self.stop = threading.Event()
        self.state: dict[str, Any] = run.read_state()
        self.metrics = MetricsLog(run.metrics_path, run / "tb",
                                  elapsed_offset_s=float(self.state.get("elapsed_s", 0.0)))
        self.sup = None
        self.sandbox_endpoint = ""
        self.progress = None
        self._signals = 0

    # ------------------------------------------------------------------------------------------------ helpers
    def _save_state(self) -> None:
        self.state["elapsed_s"] = self.metrics.elapsed_s
        self.run_dir.write_state(self.state)

    def _stage_state(self, name: str) -> dict:
        return self.state.setdefault("stages", {}).setdefault(name, {"status": "pending"})

    def _on_signal(self, signum, _frame) -> None:
        self._signals += 1
        if self._signals >= 2:
            console.print("[red]second interrupt: killing every process now[/red]")
            if self.sup is not None:
                for name, mp in list(self.sup.children.items()):
                    if mp.alive:
                        try:
                            os.killpg(mp.pid, signal.SIGKILL)
                        except ProcessLookupError:
                            pass
            os._exit(130)
        console.print("[yellow]stopping: the learner writes its checkpoint, then everything stops (Ctrl-C again to "
                      "kill at once)[/yellow]")
        self.stop.set()

    def _on_event(self, ev) -> None:
        self.metrics.log("event", self.state.get("current_stage", ""), int(self.state.get("global_step", 0)),
                         **ev.to_dict())
        if ev.state in ("failed", "restarting"):  # a one-shot child's exit code is handled by the driver itself
            console.print(f"[yellow]{ev.name}: {ev.state} {ev.message}[/yellow]")

    def _check_stop(self) -> None:
        if self.stop.is_set():
            raise Interrupted()

    # ------------------------------------------------------------------------------------------------ run
    def run(self) -> int:
        from cuda_agent.kb_metrics import environment
        from cuda_agent.supervisor import Supervisor

        old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        cfg = self.cfg
        self.state.setdefault("preset", cfg.preset)
        self.state["status"] = "running"
        self.state["environment"] = environment()
        self.state["device"] = self.device
        self.state["format"] = self.fmt
        self.state["top_kernels"] = cfg.report.top_kernels
        for s in STAGE_NAMES:
            self._stage_state(s)
        self._save_state()
        code = 0
        self.sup = Supervisor(self.run_dir.log_dir(), on_event=self._on_event)
        try:
            self._progress_start()
            self._start_sandbox()  # comes up while the model is prepared
            self._prepare()
            self._start_prewarm()
            self._wait_sandbox()
            if cfg.eval.initial:
                self._evaluate("initial", self.state["policy"])
            for stage in STAGE_NAMES:
                self._check_stop()
                self._run_stage(stage)
            self.state["status"] = "finished"
        except Interrupted:
            self.state["status"] = "interrupted"
            code = 130
        except Exception as e:  # noqa: BLE001 - the report is still written, the error is logged and shown
            log.exception("run failed")
            self.state["status"] = "failed"
            self.state["error"] = f"{type(e).__name__}: {e}"
            console.print(f"[red]run failed:[/red] {type(e).__name__}: {e}")
            code = 1
        finally:
            self._progress_stop()
            self.sup.close(order=[n for n in self.sup.children if n.startswith("actor")] +
                           [n for n in self.sup.children if n.startswith(("learner", "stage"))])
            self._save_state()
            try:
                from cuda_agent.report import build_report

                path = build_report(self.run_dir.root)
                console.print(f"report: {path}")
            except Exception as e:  # noqa: BLE001
                log.exception("report failed")
                console.print(f"[red]report failed:[/red] {e}")
            self.metrics.close()
            for s, h in old.items():
                signal.signal(s, h)
        return code

    # ------------------------------------------------------------------------------------------------ progress
    def _progress_start(self) -> None:
        if self.quiet:
            return
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.progress = Progress(TextColumn("[bold]{task.description:<16}"), BarColumn(bar_width=30),
                                 MofNCompleteColumn(), TextColumn("{task.fields[stats]}"), TimeElapsedColumn(),
                                 console=console, refresh_per_second=2)
        self.progress.start()

    def _progress_stop(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None

    def _bar(self, name: str, total: int):
        if self.progress is None:
            return None
        return self.progress.add_task(name, total=max(total, 1), stats="starting")

    def _bar_update(self, bar, completed: int | None = None, stats: str | None = None, done: bool = False) -> None:
        if bar is None or self.progress is None:
            if stats and self.quiet and done:
                log.info("%s", stats)
            return
        kw: dict[str, Any] = {}
        if completed is not None:
            kw["completed"] = completed
        if stats is not None:
            kw["stats"] = stats
        self.progress.update(bar, **kw)
        if done:
            t = self.progress.tasks[[t.id for t in self.progress.tasks].index(bar)]
            self.progress.update(bar, completed=t.total)

    # ------------------------------------------------------------------------------------------------ prepare
    def _prepare(self) -> None:
        from cuda_agent.corpus import train_and_eval_tasks
        from tasks.loaders import write_jsonl

        cfg = self.cfg
        bar = self._bar("prepare", 3)
        t0 = time.monotonic()
        train, ev = train_and_eval_tasks(cfg.tasks.train, cfg.tasks.eval, self.device, cfg.tasks.max_train_tasks,
                                         cfg.tasks.max_eval_tasks, cfg.seed)
        tdir = self.run_dir / "tasks"
        tdir.mkdir(exist_ok=True)
        write_jsonl(train, tdir / "train.jsonl")
        write_jsonl(ev, tdir / "eval.jsonl")
        from cuda_agent.corpus import demos_for

        demo_ids = sorted({t.id for t, _ in demos_for(train, self.fmt, tuple(cfg.stages.warm_start.variants))})
        rollout = [t for t in train if t.id in demo_ids] if cfg.tasks.rollout_demo_tasks_only else train
        if cfg.tasks.rollout_composed:
            rollout = self._fresh_compositions(ev)
        write_jsonl(rollout or train, tdir / "rollout.jsonl")
        with_demos = [t for t in train if t.id in demo_ids]
        # the training probe: a fixed sample of the tasks with demonstrations (the same for every run seed)
        probe = sorted(random.Random(0).sample(with_demos, min(cfg.eval.on_train_tasks, len(with_demos))),
                       key=lambda t: t.id)
        if probe:
            write_jsonl(probe, tdir / "train_probe.jsonl")
        self._bar_update(bar, 1, f"{len(train)} training tasks ({len(demo_ids)} with demonstrations), "
                                 f"{len(ev)} evaluation tasks")
        info = self._prepare_model()
        self.state.setdefault("policy", info["path"])
        self.state["model"] = info
        self.state["tasks"] = {"train": len(train), "eval": len(ev), "with_demos": len(demo_ids),
                               "probe": len(probe), "rollout": len(rollout or train)}
        self._save_state()
        self.metrics.log("stage", "prepare", 0, event="end", duration_s=time.monotonic() - t0, **{
            f"prepare/{k}": v for k, v in info.items() if isinstance(v, (int, float))})
        self._bar_update(bar, 3, f"model {info.get('params', '?')} parameters, vocab {info.get('vocab_size', '?')}",
                         done=True)

    def _fresh_compositions(self, ev: list) -> list:
        """tasks.rollout_composed fresh compositions for the PPO rollouts: chains held out from the evaluation
        split and from the warm start's composed tasks (made here first, and kept for the stage worker)."""
        from cuda_agent.corpus import fresh_compositions
        from cuda_agent.prepare import write_composed

        return fresh_compositions(self.cfg.tasks.rollout_composed, self.cfg.seed, ev,
                                  write_composed(self.run_dir, self.cfg, ev))

    def _prepare_model(self) -> dict:
        """Tokenizer and initial model in a child process (JAX stays out of the driver)."""
        from cuda_agent.services import REPO_ROOT, child_env
        from cuda_agent.supervisor import ProcessSpec

        info_path = self.run_dir / "model" / "prepare.json"
        if self.cfg.model.init == "scratch" and info_path.exists():
            return _read_json(info_path)
        argv = [sys.executable, "-m", "cuda_agent.prepare", str(self.run_dir.root), "--format", self.fmt]
        mp = self.sup.start(ProcessSpec("prepare", argv, env=child_env(), cwd=str(REPO_ROOT)))
        while mp.state in ("running", "starting"):
            if self.stop.is_set():
                self.sup.stop("prepare")
                raise Interrupted()
            time.sleep(0.2)
        if mp.returncode != 0:
            from cuda_agent.supervisor import tail as log_tail

            raise RuntimeError(f"preparing the model failed (exit {mp.returncode}):\n{log_tail(mp.log_path, 15)}")
        lines = [ln for ln in mp.log_path.read_text().splitlines() if ln.startswith("{")]
        return json.loads(lines[-1])

    def _start_sandbox(self) -> None:
        from cuda_agent.config import to_yaml
        from cuda_agent.services import cache_root, free_port, sandbox_node_spec

        cfg = self.cfg
        bar = self._bar("sandbox node", 1)
        node_yaml = self.run_dir / "sandbox.yaml"
        node_yaml.write_text(to_yaml(cfg.node))
        self.sandbox_endpoint = f"tcp://127.0.0.1:{free_port()}"
        backend = "cuda" if self.device == "cuda" else "cpu"
        spec = sandbox_node_spec("sandbox", node_yaml, self.sandbox_endpoint, self.run_dir / "sandbox.ready",
                                 cache_root(cfg.cache_dir), [f"sandbox.backend={backend}", "metrics_port=-1"],
                                 restart=True, max_restarts=cfg.supervision.max_restarts,
                                 stop_timeout_s=cfg.supervision.stop_timeout_s)
        self.sup.start(spec)
        self._sandbox_bar = (bar, backend)

    def _start_prewarm(self) -> None:
        """The baselines' prewarm (`sandbox.prewarm`) in a child beside the warm start (no task started after the
        warm start's time budget), the soonest evaluated tasks first; one result line per task in prewarm.jsonl.
        CPU backend only: on a GPU it would run beside timed work without the timing lock. A prewarm that fails
        or cannot start costs nothing but time."""
        from cuda_agent.services import cache_root, prewarm_spec

        cfg = self.cfg
        tdir = self.run_dir / "tasks"
        files = [f for f in (tdir / "eval.jsonl", tdir / "train_probe.jsonl", tdir / "rollout.jsonl") if f.exists()]
        if not cfg.prewarm_baselines or not cfg.node.sandbox.use_compile or self.device == "cuda" or not files:
            return
        try:
            self.sup.start(prewarm_spec("prewarm", self.run_dir / "sandbox.yaml", files, "cpu",
                                        cache_root(cfg.cache_dir), self.run_dir / "prewarm.jsonl",
                                        cfg.stages.warm_start.time_budget_s))
        except OSError as e:  # an optimisation, never the run's failure
            log.warning("prewarm of the baselines not started: %s", e)

    def _wait_sandbox(self) -> None:
        bar, backend = self._sandbox_bar
        self._wait_ready("sandbox", self.cfg.supervision.ready_timeout_s)
        self._bar_update(bar, 1, f"{backend} backend at {self.sandbox_endpoint}", done=True)

    def _wait_ready(self, name: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            self._check_stop()
            try:
                self.sup.wait_ready(name, min(1.0, max(0.1, deadline - time.monotonic())))
                return
            except TimeoutError:
                if time.monotonic() > deadline:
                    raise

    # ------------------------------------------------------------------------------------------------ stages
    def _run_stage(self, stage: str) -> None:
        st = self._stage_state(stage)
        spec = getattr(self.cfg.stages, stage)
        if st["status"] in ("done", "skipped", "not_wired", "no_data"):
            return
        if not spec.enabled:
            st.update(status="skipped", note="disabled in the config")
            self.metrics.log("stage", stage, int(self.state.get("global_step", 0)), event="skipped")
            self._save_state()
            return
        self.state["current_stage"] = stage
        st["status"] = "running"
        self._save_state()
        t0 = time.monotonic()
        self.metrics.log("stage", stage, int(self.state.get("global_step", 0)), event="start")
        try:
            if stage in OFFLINE_STAGES:
                changed = self._run_offline(stage, st)
            else:
                changed = self._run_ppo(stage, st)
        except Interrupted:
            st["status"] = "interrupted"
            st["duration_s"] = st.get("duration_s", 0.0) + time.monotonic() - t0
            self.metrics.log("stage", stage, int(self.state.get("global_step", 0)), event="interrupted")
            raise
        st["duration_s"] = st.get("duration_s", 0.0) + time.monotonic() - t0
        self.metrics.log("stage", stage, int(self.state.get("global_step", 0)), event="end",
                         duration_s=st["duration_s"], status=st["status"])
        self._save_state()
        if changed and self.cfg.eval.after_stages:
            self._evaluate(f"after_{stage}", self.state["policy"])
            if self.cfg.eval.on_train_tasks and (self.run_dir / "tasks" / "train_probe.jsonl").exists():
                self._evaluate(f"after_{stage}", self.state["policy"], split="train")
            if self.cfg.eval.on_rollout_tasks and (self.run_dir / "tasks" / "rollout.jsonl").exists():
                self._evaluate(f"after_{stage}", self.state["policy"], split="rollout")

    def _run_offline(self, stage: str, st: dict) -> bool:
        """Stages 0, 2 and 3 in a stage_worker process; returns whether the policy changed."""
        from cuda_agent.services import child_env
        from cuda_agent.supervisor import ProcessSpec

        cfg = self.cfg
        spec = getattr(cfg.stages, stage)
        if stage in ("rft", "value_pretrain"):
            store = self.run_dir / "learner" / "single_turn_ppo" / "stages" / "single_turn_ppo"
            if not store.exists():
                st.update(status="no_data", note="no single-turn PPO trajectories to learn from")
                return False
        out = self.run_dir.policy_dir(stage)
        argv = [sys.executable, "-m", "cuda_agent.stage_worker", "--run-dir", str(self.run_dir.root), "--stage", stage,
                "--init", str(self.state["policy"]), "--out", str(out), "--format", self.fmt, "--device", self.device,
                "--store", str(self.run_dir / "learner" / "single_turn_ppo" / "stages")]
        name = f"stage-{stage}"
        tail = JsonlTail(self.run_dir.learner_dir(stage) / "metrics" / "metrics.jsonl", from_end=True)
        mp = self.sup.start(ProcessSpec(name, argv, env=child_env(jax_memory_fraction=cfg.jax_memory_fraction),
                                        cwd=str(Path(__file__).resolve().parents[1]),
                                        restart=False, stop_timeout_s=cfg.supervision.stop_timeout_s,
                                        ok_exit_codes=(0, 4)))  # 4: nothing to train on (the stage is skipped)
        bar = self._bar(stage.replace("_", " "), spec.steps)
        base = int(self.state.get("global_step", 0))
        last_step = 0
        while True:
            for rec in tail.read():
                last_step = max(last_step, int(rec.get("step", 0)))
                fields = {k: v for k, v in rec.items() if k not in ("step", "time")}
                self.metrics.log("train", stage, base + last_step, **fields)
                loss = rec.get("sft/nll", rec.get("critic/value_loss"))
                acc = rec.get("sft/accuracy")
                stats = (f"loss {loss:.3f}" if isinstance(loss, (int, float)) else "") + \
                        (f"  token acc {acc:.1%}" if isinstance(acc, (int, float)) else "")
                tps = rec.get(f"{stage}/tokens_per_s")
                if isinstance(tps, (int, float)):
                    stats += f"  {tps:,.0f} tokens/s"
                self._bar_update(bar, last_step, stats or None)
            if mp.state not in ("running", "starting"):
                break
            if self.stop.is_set():
                self.sup.stop(name)
                raise Interrupted()
            time.sleep(0.5)
        for rec in tail.read():
            last_step = max(last_step, int(rec.get("step", 0)))
            self.metrics.log("train", stage, base + last_step,
                             **{k: v for k, v in rec.items() if k not in ("step", "time")})
        rc = mp.returncode
        if rc == 4:  # nothing to train on
            res = _read_json(self.run_dir.learner_dir(stage) / "result.json")
            st.update(status="no_data", note=f"nothing to train on ({res})")
            self._bar_update(bar, stats="no data: skipped", done=True)
            return False
        if rc == 3:
            raise Interrupted()
        if rc != 0:
            from cuda_agent.supervisor import tail as log_tail

            raise RuntimeError(f"stage {stage} failed (exit {rc}); log {mp.log_path}:\n{log_tail(mp.log_path, 15)}")
        res = _read_json(self.run_dir.learner_dir(stage) / "result.json")
        self.state["global_step"] = base + int(res.get("steps", last_step))
        self.state["policy"] = str(out)
        st.update(status="done", steps=res.get("steps"), note=f"{res.get('steps')} steps, {res.get('status')}")
        self._bar_update(bar, stats=f"done: {res.get('steps')} steps", done=True)
        return stage != "value_pretrain"

    def _run_ppo(self, stage: str, st: dict) -> bool:
        """Stages 1 and 4: the learner service and the actors (see cuda_agent.ppo_stage)."""
        from cuda_agent import ppo_stage

        return ppo_stage.run(self, stage, st)

    # ------------------------------------------------------------------------------------------------ evaluation
    def _evaluate(self, tag: str, policy: str, split: str = "eval", updates: int | None = None) -> dict | None:
        """`cuda-agent eval` on the evaluation split ("eval"), the training probe ("train") or the PPO rollout tasks
        ("rollout") in a child process, waited for; logs the KernelBench metrics as a kind="eval" record and keeps
        eval/<tag>.json and the episode rows."""
        h = self._eval_start(tag, policy, split, updates)
        if h is None:
            return None
        self._eval_wait(h)
        return self._eval_finish(h)

    def _eval_start(self, tag: str, policy: str, split: str = "eval", updates: int | None = None) -> dict | None:
        """Start an evaluation child (None when this tag was already evaluated: resume)."""
        from cuda_agent.services import eval_args, eval_spec

        cfg = self.cfg
        full_tag = tag if split == "eval" else f"{tag}-{split}"
        if full_tag in self.state.setdefault("evals", []):
            return None
        e = cfg.eval
        tasks = self.run_dir / "tasks" / _SPLIT_FILES[split]
        out = self.run_dir / "eval_runs" / full_tag
        shutil.rmtree(out, ignore_errors=True)
        args = [*eval_args(cfg, policy, tasks, out, self.fmt), "--sandbox", self.sandbox_endpoint, "--tag", full_tag,
                "--concurrency", str(max(1, min(cfg.actor.concurrent_episodes, 32)))]
        name = f"eval-{full_tag}"
        n_tasks = sum(1 for _ in open(tasks))
        bar = self._bar(f"eval {full_tag}"[:16], n_tasks * e.samples_per_task)
        mp = self.sup.start(eval_spec(name, args, jax_memory_fraction=cfg.jax_memory_fraction))
        return {"name": name, "tag": full_tag, "split": split, "out": out, "bar": bar, "mp": mp,
                "t0": time.monotonic(), "policy": policy,
                "updates": updates if updates is not None else int(self.state.get("global_step", 0)),
                "stage": self.state.get("current_stage", "")}

    def _eval_poll(self, h: dict) -> bool:
        """Update the evaluation's progress bar; True once its child has exited (or was stopped for time)."""
        mp = h["mp"]
        if mp.state not in ("running", "starting"):
            return True
        if time.monotonic() - h["t0"] > self.cfg.eval.timeout_s:
            self.sup.stop(h["name"])
            log.warning("evaluation %s took longer than %.0f s: stopped", h["tag"], self.cfg.eval.timeout_s)
            return True
        n = _count_lines(h["out"] / "episodes.jsonl")
        self._bar_update(h["bar"], n, f"{n} episodes")
        return False

    def _eval_wait(self, h: dict) -> None:
        while not self._eval_poll(h):
            if self.stop.is_set():
                self.sup.stop(h["name"])
                raise Interrupted()
            time.sleep(1.0)

    def _eval_finish(self, h: dict) -> dict | None:
        """Collect a finished evaluation: eval/<tag>.json, episodes/eval-<tag>.jsonl and a kind="eval" record."""
        out, full_tag, mp = h["out"], h["tag"], h["mp"]
        payload = _read_json(out / "metrics.json")
        if not payload.get("metrics"):
            from cuda_agent.supervisor import tail as log_tail

            console.print(f"[yellow]evaluation {full_tag} gave no metrics (exit {mp.returncode}); "
                          f"see {mp.log_path}[/yellow]")
            log.warning("evaluation %s failed:\n%s", full_tag, log_tail(mp.log_path, 15))
            self._bar_update(h["bar"], stats="failed", done=True)
            return None
        done = self.state.setdefault("evals", [])
        payload.update(tag=full_tag, split=h["split"], stage=h["stage"], order=len(done), updates=h["updates"],
                       elapsed_s=self.metrics.elapsed_s, policy_dir=str(h["policy"]))
        self.run_dir.eval_path(full_tag).write_text(json.dumps(payload, indent=2, default=str) + "\n")
        rows_path = out / "episodes.jsonl"
        if rows_path.exists():
            shutil.copy(rows_path, self.run_dir.episodes_path(f"eval-{full_tag}"))
        m = payload["metrics"]["overall"]
        self.metrics.log("eval", h["stage"], h["updates"], tag=full_tag, split=h["split"],
                         **{k: v for k, v in m.items() if not isinstance(v, dict)},
                         **payload.get("episode_rates", {}), episodes_per_s=payload.get("episodes_per_s"))
        done.append(full_tag)
        self._save_state()
        self._bar_update(h["bar"], stats=f"reward {m.get('mean_reward', 0):+.2f}  pass {m.get('pass_rate', 0):.0%}  "
                                         f"{payload.get('episodes_per_s', 0):.2f} episodes/s", done=True)
        return payload


def _read_json(path: Path) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}


def _count_lines(path: Path) -> int:
    try:
        with open(path, "rb") as f:
            return sum(1 for _ in f)
    except OSError:
        return 0


def train_cmd(
    overrides: Optional[List[str]] = typer.Argument(None, help="key=value overrides of TrainConfig, e.g. "
                                                    "stages.warm_start.steps=100 actors=2"),
    preset: str = typer.Option("local", help="Preset in configs/: local (default), smoke, h200, multihost."),
    config: Optional[Path] = typer.Option(None, help="A YAML file to use instead of a preset."),
    resume: Optional[Path] = typer.Option(None, help="Continue the run in this folder (its config.yaml is used; "
                                          "overrides still apply)."),
    run_dir: Optional[Path] = typer.Option(None, help="Run folder (default runs/<date>-<time>-<preset>)."),
    quiet: bool = typer.Option(False, help="Log lines instead of progress bars."),
) -> None:
    """Train a policy end to end: warm start, single-turn PPO, RFT, value pre-training, multi-turn PPO."""
    from cuda_agent.config import ConfigError, load_config, to_yaml

    logging.basicConfig(level=logging.INFO if quiet else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    items = list(overrides or [])
    try:
        if resume is not None:
            if not (resume / "config.yaml").exists():
                raise typer.BadParameter(f"{resume} has no config.yaml: not a run folder", param_hint="--resume")
            cfg = load_config(TrainConfig, resume / "config.yaml", items)
            root = resume
        else:
            path = config if config is not None else preset_path(preset)
            cfg = load_config(TrainConfig, path, [f"preset={preset if config is None else path.stem}", *items])
            root = run_dir or (Path(cfg.run_dir) if cfg.run_dir else
                               Path("runs") / f"{time.strftime('%Y%m%d-%H%M%S')}-{cfg.preset}")
    except (ConfigError, ValueError) as e:
        raise typer.BadParameter(str(e)) from None
    if resume is None and root.exists() and (root / "state.json").exists():
        raise typer.BadParameter(f"{root} already holds a run; use --resume {root} or another --run-dir")
    run = RunDir(root)
    cfg.run_dir = str(run.root)
    run.config_path.write_text(to_yaml(cfg))
    console.print(f"run folder: {run.root} (preset {cfg.preset}; config.yaml, metrics.jsonl, tb/, report.md)")
    code = TrainDriver(cfg, run, quiet=quiet).run()
    raise typer.Exit(code)
