"""`cuda-agent actor ...`: run an actor against a learner (training), or evaluate a frozen policy.

    cuda-agent actor run  --model DIR --learner HOST --sandbox tcp://node:5557 [--config Y.yaml] [--set k=v ...]
    cuda-agent actor eval (--checkpoint DIR | --openai-url URL --openai-model M) --tasks PATH --out results.jsonl
                          [--sandbox tcp://node:5557 ...] [--config Y.yaml] [--set k=v ...]

Thin wrappers over `actors.actor`; JAX is imported only by the commands that sample.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, List, Optional

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(help="Actors: run episodes for a learner, or evaluate a policy.", no_args_is_help=True,
                  add_completion=False, pretty_exceptions_enable=False)
console = Console(stderr=True)


def load_task_source(path: Optional[Path]) -> list:
    """Tasks of a file/folder (`tasks.loaders.load_tasks`), or the user's library plus the built-in set."""
    if path is not None:
        from tasks.loaders import load_tasks

        return load_tasks(path)
    from tasks.library import read_library

    out = list(read_library())
    try:
        from tasks import builtin  # type: ignore[attr-defined]
    except ImportError:
        return out
    seen = {t.id for t in out}
    out += [t for t in builtin.load_all() if t.id not in seen]
    return out


def _config(config: Optional[Path], overrides: List[str]):
    from actors.config import ActorConfig
    from cuda_agent.config import ConfigError, load_config

    try:
        return load_config(ActorConfig, config, overrides)
    except (ConfigError, ValueError) as e:
        raise typer.BadParameter(str(e)) from None


FLUSH_S = 60.0
"""How long an actor that ends normally waits for the learner to acknowledge its last trajectories, seconds."""
ABORT_FLUSH_S = 2.0
"""The same wait after an abort (a second signal): the supervisor's grace period is short, and a summary written
beats trajectories a gone learner will never acknowledge."""


def _flush(outbox, abort: threading.Event) -> bool:
    """Wait until the learner has acknowledged every trajectory: up to FLUSH_S, cut to ABORT_FLUSH_S from the moment
    `abort` is set (before or during the wait). Returns whether everything was acknowledged."""
    end = time.monotonic() + FLUSH_S
    cut = False
    while True:
        if abort.is_set() and not cut:
            end, cut = min(end, time.monotonic() + ABORT_FLUSH_S), True
        if outbox.flush(timeout_s=max(0.0, min(0.1, end - time.monotonic()))):
            return True
        if time.monotonic() >= end:
            return False


def _stop_on_signals() -> tuple[threading.Event, threading.Event]:
    """(stop, abort): a first SIGTERM / SIGINT sets stop (finish the running episodes), a second sets abort (cancel
    them; what finished is still flushed to the learner), a third exits at once."""
    stop, abort = threading.Event(), threading.Event()

    def handler(signum: int, _frame: Any) -> None:
        if abort.is_set():
            console.print("[red]third signal: exiting now[/red]")
            os._exit(1)
        if stop.is_set():
            console.print("[red]second signal: cancelling the running episodes (signal again to exit now)[/red]")
            abort.set()
            return
        console.print("stopping: no new episodes; finishing the running ones (signal again to cancel them)")
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    return stop, abort


def _tokenizer(path: Optional[Path]):
    from learner.tokenizer import Tokenizer

    if path is not None:
        return Tokenizer.from_file(path)
    from actors.skill import system_prompt
    from learner.tokenizer import train_bpe

    # No tokenizer given (an external endpoint): one trained on the skill text counts context tokens.
    corpus = [system_prompt(f, m, 8) for f in ("cpu", "cubin", "extension") for m in ("multi_turn", "single_turn")]
    return train_bpe(corpus * 8, vocab_size=2048)


def _stages(cfg, client_id: str, curve_secret_key: Optional[Path], server_public_key: Optional[Path]):
    from actors.sandbox_stages import SandboxStages
    from sandbox.client import SandboxClient

    endpoints = cfg.sandbox_endpoint_list
    if not endpoints:
        raise typer.BadParameter("no sandbox node endpoints (sandbox_endpoints=tcp://host:5557,...)")
    client = SandboxClient(endpoints, client_id=client_id, attempts=cfg.stages.attempts,
                           curve_secret_key=curve_secret_key, server_public_key=server_public_key)
    return SandboxStages(client, cfg.stages)


def resolve_format(requested: str, stages, timeout_s: float = 60.0) -> str:
    """"auto" -> "cubin" for cuda nodes, "cpu" for cpu nodes (asks the nodes). Exits with status 2 and a clear
    message when no node answers within timeout_s."""
    if requested != "auto":
        return requested
    backend = stages.backend(timeout_s)
    if backend is None:
        console.print(f"[red]no sandbox node answered at {', '.join(stages.client.endpoints)} within {timeout_s:g} s; "
                      "start one (cuda-agent sandbox serve) or set agent.solution_format explicitly[/red]")
        raise typer.Exit(2)
    return "cubin" if backend == "cuda" else "cpu"


def _summary_table(summary: dict[str, Any]) -> Table:
    t = Table(title=f"actor {summary.get('actor_id', '')}")
    t.add_column("figure")
    t.add_column("value")
    tm = summary.get("time", {})
    wall = max(tm.get("wall_s", 0.0), 1e-9)
    rows = [("episodes", summary.get("episodes")), ("by status", summary.get("by_status")),
            ("by weights version", summary.get("by_version")), ("mean reward", summary.get("mean_reward")),
            ("episodes / hour", f"{summary.get('episodes', 0) / wall * 3600:.1f}"),
            ("sampling busy", f"{tm.get('sampling_s', 0) / wall:.1%}"),
            ("sandbox busy", f"{tm.get('sandbox_s', 0) / wall:.1%}"), ("idle", f"{tm.get('idle_s', 0) / wall:.1%}"),
            ("sampler calls / sequences", f"{summary['batcher']['calls']} / {summary['batcher']['sequences']}")]
    for k, v in rows:
        t.add_row(k, str(v))
    return t


@app.command("run")
def run_cmd(
    config: Optional[Path] = typer.Option(None, "--config", help="YAML preset (ActorConfig fields)."),
    overrides: List[str] = typer.Option([], "--set", help="ActorConfig override key=value (repeatable), e.g. "
                                                          "agent.max_turns=16"),
    model: Path = typer.Option(..., help="Model folder: config.json (Hugging Face) and tokenizer.json."),
    learner: Optional[str] = typer.Option(None, help="Learner host: trajectories on :5555, weights on :5556 "
                                                      "(or set trajectories_endpoint / weights_endpoint)."),
    sandbox: Optional[List[str]] = typer.Option(None, help="Sandbox node endpoint (repeatable)."),
    tasks: Optional[Path] = typer.Option(None, help="Task file or folder (default: library + built-in set)."),
    max_episodes: Optional[int] = typer.Option(None, help="Stop after this many episodes (default: run until "
                                                          "SIGTERM)."),
    curve_secret_key: Optional[Path] = typer.Option(None, help="CURVE secret key file for the sandbox nodes."),
    server_public_key: Optional[Path] = typer.Option(None, help="The nodes' CURVE public key file."),
    summary_out: Optional[Path] = typer.Option(None, help="Write the final summary here as JSON."),
) -> None:
    """Training: sample episodes with the learner's newest weights, ship trajectories to the learner."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cfg = _config(config, overrides)
    if learner:
        cfg.trajectories_endpoint = cfg.trajectories_endpoint or f"tcp://{learner}:5555"
        cfg.weights_endpoint = cfg.weights_endpoint or f"tcp://{learner}:5556"
    if sandbox:
        cfg.sandbox_endpoints = ",".join(sandbox)
    if not cfg.trajectories_endpoint or not cfg.weights_endpoint:
        raise typer.BadParameter("need the learner: --learner HOST, or trajectories_endpoint= and weights_endpoint=")
    if cfg.sampler_memory_fraction is not None:
        from actors.sampler import configure_device_memory

        configure_device_memory(cfg.sampler_memory_fraction)
    from actors.actor import Actor, TrajectorySink, cycle_tasks, default_actor_id, run_actor
    from actors.policy import jax_policy_from_update, sampler_timing_lock
    from actors.weights import PolicyVersions, WeightsRefresher
    from learner.chat import ChatFormat
    from learner.hf_checkpoint import read_config
    from protocol.auth import client_curve
    from protocol.trajectory_channel import TrajectoryOutbox
    from protocol.weights_channel import WeightsFetcher

    actor_id = cfg.actor_id or default_actor_id()
    cfg.actor_id = actor_id
    tok = _tokenizer(model)
    model_config = read_config(model, **cfg.model_overrides())
    task_list = load_task_source(tasks)
    stages = _stages(cfg, actor_id, curve_secret_key, server_public_key)
    fmt = resolve_format(cfg.agent.solution_format, stages)
    sampler_config = cfg.sampler_config()
    learner_curve = client_curve(cfg.learner_curve_secret_key, cfg.learner_public_key, who="actor")
    fetcher = WeightsFetcher(cfg.weights_endpoint, actor_id=actor_id, curve=learner_curve)
    lock = sampler_timing_lock(cfg.timing_lock, cfg.timing_lock_dir or None)
    refresher = WeightsRefresher(fetcher, lambda u: jax_policy_from_update(u, model_config, sampler_config, tok.decode,
                                                                           cfg.seed, timing_lock=lock))
    outbox = TrajectoryOutbox(cfg.trajectories_endpoint, actor_id=actor_id, max_pending=cfg.max_pending_trajectories,
                              curve=learner_curve)
    actor = Actor(cfg, ChatFormat(tok), stages, PolicyVersions(), TrajectorySink(outbox, actor_id), fmt, refresher)
    console.print(f"actor {actor_id}: {len(task_list)} tasks, format {fmt}, learner {cfg.trajectories_endpoint} / "
                  f"{cfg.weights_endpoint}, sandbox {cfg.sandbox_endpoints}")
    stop, abort = _stop_on_signals()
    try:
        summary = run_actor(actor, cycle_tasks(task_list, cfg.seed, cfg.group_size), max_episodes=max_episodes, stop=stop,
                            abort=abort)
        if not _flush(outbox, abort):
            console.print(f"[yellow]{outbox.pending} trajectories not acknowledged by the learner at exit[/yellow]")
        summary["outbox"] = dict(outbox.stats)
    finally:
        outbox.close()
        fetcher.close()
        stages.client.close()
    console.print(_summary_table(summary))
    if summary_out:
        summary_out.write_text(json.dumps(summary, indent=2, default=str))


@app.command("eval")
def eval_cmd(
    config: Optional[Path] = typer.Option(None, "--config", help="YAML preset (ActorConfig fields)."),
    overrides: List[str] = typer.Option([], "--set", help="ActorConfig override key=value (repeatable), e.g. "
                                                          "agent.max_turns=16"),
    out: Path = typer.Option(..., help="Per-task results, one JSON line per episode."),
    checkpoint: Optional[Path] = typer.Option(None, help="Hugging Face checkpoint folder (JAX sampling)."),
    openai_url: Optional[str] = typer.Option(None, help="OpenAI-compatible base URL, e.g. http://host:8000/v1"),
    openai_model: Optional[str] = typer.Option(None, help="Model name at that endpoint."),
    api_key_env: Optional[str] = typer.Option(None, help="Name of the environment variable holding the API key."),
    tokenizer: Optional[Path] = typer.Option(None, help="tokenizer.json for context accounting (default: the "
                                                         "checkpoint's; for an endpoint, one trained on the skill "
                                                         "text)."),
    sandbox: Optional[List[str]] = typer.Option(None, help="Sandbox node endpoint (repeatable)."),
    tasks: Optional[Path] = typer.Option(None, help="Task file or folder (default: library + built-in set)."),
    samples: int = typer.Option(1, help="Episodes per task."),
    single_turn: bool = typer.Option(False, help="Single-turn mode (one reply holds the solution)."),
    curve_secret_key: Optional[Path] = typer.Option(None, help="CURVE secret key file for the sandbox nodes."),
    server_public_key: Optional[Path] = typer.Option(None, help="The nodes' CURVE public key file."),
) -> None:
    """Evaluation: the same loop with a frozen checkpoint or an external endpoint; writes per-task results."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if (checkpoint is None) == (openai_url is None):
        raise typer.BadParameter("give exactly one policy: --checkpoint DIR or --openai-url URL (with --openai-model)")
    if openai_url and not openai_model:
        raise typer.BadParameter("--openai-url needs --openai-model")
    cfg = _config(config, overrides)
    if sandbox:
        cfg.sandbox_endpoints = ",".join(sandbox)
    if single_turn:
        cfg.agent.mode = "single_turn"
    cfg.stages.priority = 0  # evaluation jobs are served before training rollouts
    from actors.actor import Actor, ResultWriter, default_actor_id, repeat_tasks, run_actor
    from actors.weights import PolicyVersions
    from learner.chat import ChatFormat

    actor_id = cfg.actor_id or default_actor_id()
    cfg.actor_id = actor_id
    tok = _tokenizer(tokenizer or checkpoint)
    chat = ChatFormat(tok)
    if checkpoint is not None:
        if cfg.sampler_memory_fraction is not None:
            from actors.sampler import configure_device_memory

            configure_device_memory(cfg.sampler_memory_fraction)
        from actors.policy import jax_policy_from_checkpoint, sampler_timing_lock

        policy = jax_policy_from_checkpoint(checkpoint, cfg.sampler_config(), detokenize=tok.decode, seed=cfg.seed,
                                            timing_lock=sampler_timing_lock(cfg.timing_lock,
                                                                            cfg.timing_lock_dir or None),
                                            **cfg.model_overrides())
    else:
        from actors.openai_policy import OpenAIPolicy

        key = os.environ.get(api_key_env) if api_key_env else None
        if api_key_env and not key:
            raise typer.BadParameter(f"environment variable {api_key_env} is not set")
        policy = OpenAIPolicy(openai_url, openai_model, chat, api_key=key, max_concurrency=cfg.concurrent_episodes)
    task_list = load_task_source(tasks)
    if not task_list:
        raise typer.BadParameter("no tasks to evaluate")
    stages = _stages(cfg, actor_id, curve_secret_key, server_public_key)
    writer = ResultWriter(out)
    try:
        fmt = resolve_format(cfg.agent.solution_format, stages)
        actor = Actor(cfg, chat, stages, PolicyVersions(policy), writer, fmt)
        stop, abort = _stop_on_signals()
        summary = run_actor(actor, repeat_tasks(task_list, samples), stop=stop, abort=abort)
    finally:
        stages.client.close()
    summary["results"] = str(out)
    out.with_suffix(".summary.json").write_text(json.dumps(summary, indent=2, default=str))
    console.print(_summary_table(summary))
    console.print(f"per-task results: {out} ({writer.rows} rows); summary: {out.with_suffix('.summary.json')}")


def main() -> None:  # pragma: no cover - `python -m actors.cli`
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
