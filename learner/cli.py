"""`cuda-agent learner ...`: run the learner service, or check the learner on the synthetic task.

    cuda-agent learner serve --init POLICY_DIR --run-dir RUN [--config learner.yaml] [--set ppo.lr=...]
                             [--trajectories tcp://*:5555] [--weights tcp://*:5556] [--stage multi_turn_ppo]
                             [--max-updates N] [--time-budget-s S] [--publish-dtype bfloat16]
    cuda-agent learner synthetic [--seeds 0,1,2] [--updates 60]

`serve` loads a Hugging Face policy folder (`learner.hf_checkpoint`; a critic under POLICY_DIR/critic, else
one is made from the policy), resumes from RUN/checkpoints when there is one, and serves until the budget or
SIGTERM / SIGINT (then it writes its checkpoint). Exit codes: 0 done, 3 stopped by a signal, 1 error.
"""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(help="Learner: PPO service for the actors, and a synthetic self-check.", no_args_is_help=True,
                  add_completion=False, pretty_exceptions_enable=False)
console = Console(stderr=True)
EXIT_DONE, EXIT_ERROR, EXIT_STOPPED = 0, 1, 3


@app.command()
def serve(
    init: Path = typer.Option(..., help="policy folder (Hugging Face layout; critic under critic/ if present)"),
    run_dir: Path = typer.Option(..., help="folder for spool, checkpoints, metrics, stage trajectories"),
    config: Optional[Path] = typer.Option(None, help="LearnerConfig YAML (learner.config)"),
    set_: Optional[List[str]] = typer.Option(None, "--set", help="LearnerConfig override key=value (repeat)"),
    trajectories: str = typer.Option("tcp://*:5555", help="bind address of the trajectory receiver"),
    weights: str = typer.Option("tcp://*:5556", help="bind address of the weights publisher"),
    stage: str = typer.Option("multi_turn_ppo", help="single_turn_ppo or multi_turn_ppo"),
    max_updates: int = typer.Option(0, help="stop after N updates (0 = until stopped)"),
    time_budget_s: float = typer.Option(0.0, help="stop after S seconds (0 = no limit)"),
    publish_dtype: Optional[str] = typer.Option(None, help="float32 or bfloat16 (default: parameter dtype)"),
    curve: str = typer.Option("auto", help="CURVE on both channels: auto (on beyond loopback), always, never"),
    curve_secret_key: str = typer.Option("", help="the learner's CURVE secret key file (server.key_secret)"),
    curve_authorized_keys: str = typer.Option("", help="folder of the actors' authorised public key files"),
) -> None:
    """Serve PPO for actors: acked trajectories in, weights out, checkpoints and metrics in RUN_DIR.

    Bound beyond loopback (the default tcp://*:5555 / :5556), both channels require CURVE keys (make them with
    `cuda-agent learner keys DIR`), unless --curve never."""
    from cuda_agent.config import ConfigError, load_config
    from learner.config import LearnerConfig, ServiceConfig

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        cfg = load_config(LearnerConfig, config, set_ or [])
        svc = ServiceConfig(trajectories=trajectories, weights=weights, stage=stage, max_updates=max_updates,
                            time_budget_s=time_budget_s, publish_dtype=publish_dtype, curve=curve,
                            curve_secret_key=curve_secret_key, curve_authorized_keys=curve_authorized_keys)
        from protocol.auth import server_curve  # the key check before the model is loaded

        for ep in (trajectories, weights):
            server_curve(ep, curve, curve_secret_key, curve_authorized_keys, who="learner",
                         init_hint="`cuda-agent learner keys DIR`")
    except (ConfigError, ValueError, FileNotFoundError) as e:
        raise typer.BadParameter(str(e)) from None
    from cuda_agent.config import to_yaml
    from learner.hf_checkpoint import load_critic, load_pretrained
    from learner.model import Critic
    from learner.service import STATUS_STOPPED, LearnerService

    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "learner_config.yaml").write_text(to_yaml(cfg))
    stop = threading.Event()
    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, lambda *_: stop.set())
    policy = load_pretrained(init)
    critic_dir = init / "critic"
    critic = load_critic(critic_dir) if (critic_dir / "config.json").exists() else Critic.from_policy(policy)
    service = LearnerService(cfg, svc, run_dir, policy, critic)
    del policy, critic
    try:
        service.start()
        console.print(f"learner {stage}: trajectories {service.receiver.endpoint}, weights {service.weights.endpoint}")
        status = service.run(stop)
        console.print(f"learner {stage}: {status} after update {service.update} (weights v{service.version})")
    except Exception:
        logging.getLogger("learner").exception("learner failed")
        raise typer.Exit(EXIT_ERROR)
    finally:
        service.close()
    raise typer.Exit(EXIT_STOPPED if status == STATUS_STOPPED else EXIT_DONE)


@app.command()
def keys(
    directory: Path = typer.Argument(..., help="folder to write the keys into"),
    actors: int = typer.Option(1, help="how many actor key pairs to make"),
) -> None:
    """Write CURVE keys for the learner and its actors, and print the settings each side takes."""
    from protocol.auth import init_keys

    paths = init_keys(directory, [f"actor{i}" for i in range(actors)])
    typer.echo(f"learner: --curve-secret-key {paths['server_secret_key']} "
               f"--curve-authorized-keys {paths['authorized_keys']}")
    for i in range(actors):
        typer.echo(f"actor{i}: --set learner_curve_secret_key={paths[f'client_actor{i}_secret_key']} "
                   f"--set learner_public_key={paths['server_public_key']}")


@app.command()
def synthetic(
    seeds: str = typer.Option("0,1,2", help="comma-separated seeds"),
    updates: int = typer.Option(60, help="most PPO updates per seed"),
    episodes: int = typer.Option(64, help="episodes per update"),
) -> None:
    """PPO on the synthetic two-turn task (learner.synthetic): updates until the mean reward is half-way to
    the maximum, per seed. A quick check that an installation's learner learns (CPU is fine)."""
    from learner.synthetic import run_ppo

    table = Table("seed", "initial reward", "final reward (last 3)", "updates to half-way", "wall s")
    ok = True
    for seed in (int(s) for s in seeds.split(",") if s.strip()):
        r = run_ppo(seed, updates, episodes, stop_at_half=False)
        ok &= r["updates_to_half"] is not None
        table.add_row(str(seed), f"{r['initial']:.3f}", f"{r['final']:.3f}", str(r["updates_to_half"]), f"{r['wall_s']:.1f}")
    Console().print(table)
    raise typer.Exit(0 if ok else 1)
