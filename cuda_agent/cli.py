"""The `cuda-agent` console command: a thin Typer app that mounts each package's subcommands.

Each package owns its commands in its own `cli.py` (e.g. `sandbox/cli.py`); this module only wires them
together, importing lazily enough that `cuda-agent --help` stays fast.
"""

from __future__ import annotations

import typer

app = typer.Typer(
    name="cuda-agent",
    help="Agentic RL for CUDA kernel generation (learner, actors, sandbox, tasks).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _mount() -> None:
    """Register the subcommands that exist. A package adds itself here once its command works."""
    from actors.cli import app as actor_app

    app.add_typer(actor_app, name="actor")
    from sandbox.cli import app as sandbox_app

    app.add_typer(sandbox_app, name="sandbox")
    from tasks.cli import app as tasks_app

    app.add_typer(tasks_app, name="tasks")
    from learner.cli import app as learner_app

    app.add_typer(learner_app, name="learner")
    from cuda_agent.eval import eval_cmd

    app.command("eval")(eval_cmd)
    from cuda_agent.train import train_cmd

    app.command("train")(train_cmd)


def main() -> None:
    _mount()
    app()


if __name__ == "__main__":
    main()
