"""`cuda-agent eval`: evaluate a policy on KernelBench-format tasks and print the KernelBench metrics.

    cuda-agent eval --checkpoint DIR                       [--tasks SOURCE] [--level N] [--samples N] [--multi-turn]
    cuda-agent eval --openai-url URL --openai-model NAME   [...]
    cuda-agent eval ... --sandbox tcp://node:5557           (default: start a local sandbox node for the run)

Policy: a Hugging Face checkpoint folder (config.json, safetensors, tokenizer.json; sampled locally with JAX), or an
OpenAI-compatible chat-completions endpoint. Tasks (`--tasks`): a built-in split name (default `auto_eval`: the CPU
or GPU evaluation split), `builtin` (every built-in task), a KernelBench folder (`level1/`, `level2/`, ...), a
JSONL file, or a folder of `.py` references; `--level` keeps one level. Episodes are single-turn by default
(one reply holds the solution) or agentic (`--multi-turn`, tools, up to `--max-turns` replies); `--samples` per task.

Output folder (`--out`, default runs/eval-<time>): episodes.jsonl (one result row per episode, with the final
files), metrics.json (KernelBench metrics per level, the device and torch version, the policy and settings),
metrics.md (the table). The same metrics function (cuda_agent.kb_metrics) scores `cuda-agent sandbox eval` over
a folder of solutions and the evaluations inside `cuda-agent train`.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any, List, Optional, Sequence

import typer
from rich.console import Console

console = Console(stderr=True)


def load_eval_tasks(source: str, device: str, level: int | None = None, max_tasks: int = 0) -> list:
    """Tasks to evaluate: built-in split name, "builtin", or a path (see the module doc). CPU runs take GPU-sized
    built-in tasks at their CPU size. Raises ValueError when nothing is left."""
    from tasks import builtin

    from cuda_agent.corpus import load_source

    if source == "builtin":
        tasks = builtin.load_all()
    else:
        tasks = load_source(source, device)
    if device != "cuda":
        tasks = [builtin.at_cpu_size(t) for t in tasks]
    if level is not None:
        tasks = [t for t in tasks if t.level == level]
    if max_tasks:
        tasks = tasks[:max_tasks]
    if not tasks:
        raise ValueError(f"no tasks from {source!r}" + (f" at level {level}" if level is not None else ""))
    return tasks


def _tokenizer_for(checkpoint: Optional[Path], tokenizer: Optional[Path]):
    from learner.tokenizer import Tokenizer

    if tokenizer is not None:
        return Tokenizer.from_file(tokenizer)
    if checkpoint is not None:
        return Tokenizer.from_file(checkpoint)
    # An external endpoint tokenizes itself; ours only counts context tokens: train one on the skill text.
    from actors.skill import system_prompt
    from learner.tokenizer import train_bpe

    corpus = [system_prompt(f, m, 8) for f in ("cpu", "cubin", "extension") for m in ("multi_turn", "single_turn")]
    return train_bpe(corpus * 8, vocab_size=2048)


class _Progress:
    """A rich progress bar over evaluation episodes with mean reward and pass rate (or plain lines when quiet)."""

    def __init__(self, total: int, quiet: bool, title: str):
        self.total, self.quiet, self.done, self.rewards, self.passed = total, quiet, 0, [], 0
        self.t0 = time.monotonic()
        self._lock = threading.Lock()
        self.bar = None
        if not quiet:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                TextColumn("{task.fields[stats]}"), TimeElapsedColumn(), console=console)
            self.task = self.bar.add_task(title, total=total, stats="")

    def __enter__(self):
        if self.bar is not None:
            self.bar.start()
        return self

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.stop()

    def on_episode(self, episode) -> None:
        with self._lock:
            self.done += 1
            self.rewards.append(float(episode.reward))
            final = episode.final
            self.passed += int(final is not None and final.status == "ok")
            eps = self.done / max(time.monotonic() - self.t0, 1e-9)
            stats = (f"reward {sum(self.rewards) / len(self.rewards):+.2f}  pass {self.passed / self.done:.0%}  "
                     f"{eps:.2f} episodes/s")
            if self.bar is not None:
                self.bar.update(self.task, completed=self.done, stats=stats)
            elif self.done == self.total or self.done % 10 == 0:
                logging.getLogger("cuda_agent.eval").info("%d/%d episodes: %s", self.done, self.total, stats)


def eval_actor_config(*, seed: int, concurrent_episodes: int, mode: str, max_turns: int, temperature: float,
                      max_new_tokens: int, max_context_tokens: int, fmt: str, actor_overrides: Sequence[str] = ()):
    """The `actors.config.ActorConfig` of an evaluation actor. Raises ConfigError / ValueError (naming the field)
    for a bad setting, so a caller can refuse it before any process starts."""
    from actors.config import ActorConfig

    from cuda_agent.config import load_config

    return load_config(ActorConfig, None, [
        f"seed={seed}", f"concurrent_episodes={concurrent_episodes}", f"max_batch={max(concurrent_episodes, 1)}",
        f"agent.mode={mode}", f"agent.max_turns={1 if mode == 'single_turn' else max_turns}",
        f"agent.temperature={temperature}", f"agent.max_new_tokens_per_turn={max_new_tokens}",
        f"agent.max_context_tokens={max_context_tokens}", f"agent.solution_format={fmt}", "stages.priority=0",
        # a finite task list: a failing policy or endpoint ends each episode at once (no waits between them)
        "actor_id=eval", "failure_backoff_s=0", *actor_overrides])


def run_evaluation(*, tasks: list, out_dir: Path, sandbox_endpoints: List[str], checkpoint: Optional[Path] = None,
                   openai_url: Optional[str] = None, openai_model: Optional[str] = None, api_key: Optional[str] = None,
                   tokenizer: Optional[Path] = None, samples: int = 1, mode: str = "single_turn", max_turns: int = 3,
                   temperature: float = 0.0, max_new_tokens: int = 2048, max_context_tokens: int = 8192,
                   concurrent_episodes: int = 8, fmt: str = "auto", seed: int = 0, quiet: bool = False,
                   actor_overrides: List[str] = (), extra: Optional[dict] = None) -> dict[str, Any]:
    """Run the episodes, write episodes.jsonl, metrics.json and metrics.md into out_dir, and return the metrics
    payload ({"metrics", "environment", "policy", "settings", "per_task", ...}).

    Raises ValueError for a bad policy choice, RuntimeError when no sandbox node answers.
    """
    from actors.actor import Actor, ResultWriter, repeat_tasks, run_actor
    from actors.sandbox_stages import SandboxStages
    from actors.weights import PolicyVersions
    from learner.chat import ChatFormat
    from sandbox.client import SandboxClient

    from cuda_agent.kb_metrics import (environment, episode_rates, kernelbench_metrics, sample_from_result_row,
                                       write_report)

    if (checkpoint is None) == (openai_url is None):
        raise ValueError("give exactly one policy: a checkpoint folder or an OpenAI-compatible URL")
    out_dir.mkdir(parents=True, exist_ok=True)
    results = out_dir / "episodes.jsonl"
    results.unlink(missing_ok=True)
    cfg = eval_actor_config(seed=seed, concurrent_episodes=concurrent_episodes, mode=mode, max_turns=max_turns,
                            temperature=temperature, max_new_tokens=max_new_tokens,
                            max_context_tokens=max_context_tokens, fmt=fmt, actor_overrides=actor_overrides)
    tok = _tokenizer_for(checkpoint, tokenizer)
    chat = ChatFormat(tok)
    if checkpoint is not None:
        from actors.policy import jax_policy_from_checkpoint
        from actors.sampler import SamplerConfig

        policy = jax_policy_from_checkpoint(checkpoint, SamplerConfig(max_cache_len=max_context_tokens),
                                            detokenize=tok.decode, seed=seed, **cfg.model_overrides())
        policy_name = f"checkpoint:{checkpoint}"
    else:
        if not openai_model:
            raise ValueError("an OpenAI-compatible URL needs a model name")
        from actors.openai_policy import OpenAIPolicy

        policy = OpenAIPolicy(openai_url, openai_model, chat, api_key=api_key, max_concurrency=concurrent_episodes)
        policy_name = f"openai:{openai_model}@{openai_url}"
    client = SandboxClient(sandbox_endpoints, client_id="eval", attempts=cfg.stages.attempts)
    stages = SandboxStages(client, cfg.stages)
    writer = ResultWriter(results)
    t0 = time.monotonic()
    try:
        if fmt == "auto":
            backend = stages.backend(120.0)
            if backend is None:
                raise RuntimeError(f"no sandbox node answered at {sandbox_endpoints}")
            fmt = "cubin" if backend == "cuda" else "cpu"
            cfg.agent.solution_format = fmt
        with _Progress(len(tasks) * samples, quiet, f"eval {mode}") as prog:
            actor = Actor(cfg, chat, stages, PolicyVersions(policy), writer, fmt, on_episode=prog.on_episode)
            summary = run_actor(actor, repeat_tasks(tasks, samples))
    finally:
        client.close()
    wall = time.monotonic() - t0
    rows = [json.loads(line) for line in results.read_text().splitlines() if line.strip()] if results.exists() else []
    if not rows:
        raise RuntimeError(f"no episode finished (actor summary: {summary})")
    level_of = {t.id: t.level for t in tasks}
    for r in rows:
        r.setdefault("level", level_of.get(r.get("task_id"), 0))
    samples_ = [sample_from_result_row(r) for r in rows]
    metrics = kernelbench_metrics(samples_)
    per_task: dict[str, dict] = {}
    for s in samples_:  # best sample per task, for the report's per-task table
        cur = per_task.get(s.task_id)
        if cur is None or s.reward > cur["reward"]:
            per_task[s.task_id] = {"reward": s.reward, "status": s.status, "speedup_eager": s.speedup_eager,
                                   "speedup_compile": s.speedup_compile}
    env = environment()
    payload = {"policy": policy_name, "settings": {"mode": mode, "samples": samples, "format": fmt,
                                                   "temperature": temperature, "max_turns": max_turns,
                                                   "max_new_tokens": max_new_tokens, "tasks": len(tasks)},
               "per_task": per_task, "wall_s": wall, "episodes_per_s": len(rows) / max(wall, 1e-9),
               "episode_rates": episode_rates(rows),
               "actor": {k: summary.get(k) for k in ("episodes", "by_status", "episode_crashes", "time")},
               **(extra or {})}
    write_report(metrics, env, out_dir / "metrics.json", out_dir / "metrics.md", payload)
    return {"metrics": metrics, "environment": env, **payload}


def eval_cmd(
    overrides: Optional[List[str]] = typer.Argument(None, help="ActorConfig overrides key=value, e.g. "
                                                    "agent.top_p=0.95"),
    checkpoint: Optional[Path] = typer.Option(None, help="Hugging Face checkpoint folder (JAX sampling)."),
    openai_url: Optional[str] = typer.Option(None, help="OpenAI-compatible base URL, e.g. http://host:8000/v1."),
    openai_model: Optional[str] = typer.Option(None, help="Model name at that endpoint."),
    api_key_env: Optional[str] = typer.Option(None, help="Environment variable that holds the endpoint's API key."),
    tasks: str = typer.Option("auto_eval", help="Built-in split, 'builtin', a KernelBench folder, .jsonl or .py "
                                                "folder."),
    level: Optional[int] = typer.Option(None, help="Only tasks of this KernelBench level."),
    max_tasks: int = typer.Option(0, help="At most this many tasks (0 = all)."),
    samples: int = typer.Option(1, help="Episodes per task."),
    multi_turn: bool = typer.Option(False, "--multi-turn", help="Agentic episodes with tools (default: single-turn)."),
    max_turns: int = typer.Option(8, help="Replies per agentic episode."),
    temperature: float = typer.Option(0.0, help="Sampling temperature (0 = greedy)."),
    max_new_tokens: int = typer.Option(2048, help="Tokens per reply."),
    max_context_tokens: int = typer.Option(8192, help="Context limit of an episode."),
    concurrency: int = typer.Option(8, help="Episodes in flight at once."),
    fmt: str = typer.Option("auto", "--format", help="cpu | cubin | extension | auto (from the sandbox backend)."),
    tokenizer: Optional[Path] = typer.Option(None, help="tokenizer.json (default: the checkpoint's)."),
    sandbox: Optional[List[str]] = typer.Option(None, help="Sandbox node endpoint (repeatable); default: start one."),
    sandbox_workers: int = typer.Option(0, help="Workers of the local sandbox node (0 = its default)."),
    sandbox_opt: Optional[List[str]] = typer.Option(None, help="ServiceConfig override for the local node (repeat), "
                                                    "e.g. sandbox.reps=10."),
    out: Optional[Path] = typer.Option(None, help="Output folder (default runs/eval-<time>)."),
    seed: int = typer.Option(0),
    quiet: bool = typer.Option(False, help="No progress bar (log lines instead)."),
    tag: str = typer.Option("", help="A label stored in metrics.json (the train driver's evaluation point)."),
) -> None:
    """Evaluate a checkpoint or an OpenAI-compatible endpoint; print the KernelBench metrics table."""
    from cuda_agent.kb_metrics import rich_table

    logging.basicConfig(level=logging.INFO if quiet else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if (checkpoint is None) == (openai_url is None):
        raise typer.BadParameter("give exactly one policy: --checkpoint DIR or --openai-url URL (with --openai-model)")
    if openai_url and not openai_model:
        raise typer.BadParameter("--openai-url needs --openai-model")
    key = None
    if api_key_env:
        key = os.environ.get(api_key_env)
        if not key:
            raise typer.BadParameter(f"environment variable {api_key_env} is not set")
    # every setting is checked before a sandbox node starts or a folder is made
    if samples < 1:
        raise typer.BadParameter(f"must be >= 1, got {samples}", param_hint="--samples")
    if checkpoint is not None and not (checkpoint / "config.json").is_file():
        raise typer.BadParameter(f"{checkpoint}: not a checkpoint folder (no config.json)", param_hint="--checkpoint")
    from cuda_agent.config import ConfigError

    try:
        eval_actor_config(seed=seed, concurrent_episodes=concurrency, mode="multi_turn" if multi_turn else "single_turn",
                          max_turns=max_turns, temperature=temperature, max_new_tokens=max_new_tokens,
                          max_context_tokens=max_context_tokens, fmt=fmt, actor_overrides=list(overrides or []))
    except (ConfigError, ValueError) as e:
        raise typer.BadParameter(str(e)) from None
    from sandbox.evaluator import resolve_backend

    device = resolve_backend("auto")
    try:
        task_list = load_eval_tasks(tasks, device, level, max_tasks)
    except (ValueError, FileNotFoundError) as e:
        raise typer.BadParameter(str(e), param_hint="--tasks") from None
    out = out or Path("runs") / time.strftime("eval-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    sup = None
    endpoints = list(sandbox or [])
    if not endpoints:
        sup, endpoints = _local_node(out, device, sandbox_workers, list(sandbox_opt or []))
    try:
        payload = run_evaluation(tasks=task_list, out_dir=out, sandbox_endpoints=endpoints, checkpoint=checkpoint,
                                 openai_url=openai_url, openai_model=openai_model, api_key=key, tokenizer=tokenizer,
                                 samples=samples, mode="multi_turn" if multi_turn else "single_turn",
                                 max_turns=max_turns, temperature=temperature, max_new_tokens=max_new_tokens,
                                 max_context_tokens=max_context_tokens, concurrent_episodes=concurrency, fmt=fmt,
                                 seed=seed, quiet=quiet, actor_overrides=list(overrides or []),
                                 extra={"tag": tag} if tag else None)
    except (ValueError, RuntimeError) as e:
        console.print(f"[red]error:[/red] {e}")
        raise typer.Exit(1) from None
    finally:
        if sup is not None:
            sup.close()
    out_console = Console()
    if not out_console.is_terminal:  # piped or logged: room for every column
        out_console = Console(width=160)
    out_console.print(rich_table(payload["metrics"], f"KernelBench metrics: {payload['policy']}",
                                 payload["environment"]))
    console.print(f"results: {out / 'episodes.jsonl'}; metrics: {out / 'metrics.json'}, {out / 'metrics.md'}")


def _local_node(out: Path, device: str, workers: int, opts: List[str]):
    """Start a sandbox node for this evaluation under a Supervisor; returns (supervisor, [endpoint])."""
    from cuda_agent.config import to_yaml
    from cuda_agent.services import cache_root, free_port, sandbox_node_spec
    from cuda_agent.supervisor import Supervisor
    from sandbox.service import ServiceConfig

    cfg_path = out / "sandbox.yaml"
    cfg_path.write_text(to_yaml(ServiceConfig()))
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    overrides = [f"sandbox.backend={'cuda' if device == 'cuda' else 'cpu'}", "metrics_port=-1",
                 f"workers={workers}", *opts]
    sup = Supervisor(out / "logs")
    sup.start(sandbox_node_spec("sandbox", cfg_path, endpoint, out / "sandbox.ready", cache_root(), overrides))
    console.print(f"starting a local sandbox node at {endpoint} (log: {out / 'logs' / 'sandbox.log'})")
    try:
        sup.wait_ready("sandbox", 600)
    except (RuntimeError, TimeoutError):
        sup.close()
        raise
    return sup, [endpoint]
