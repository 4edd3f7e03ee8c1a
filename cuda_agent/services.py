"""Command lines of the child processes `cuda-agent train` and `cuda-agent eval` start (for cuda_agent.supervisor),
and small helpers around them (free loopback ports, the cache folder shared across runs).

Every child is one of the project's own commands, run with this interpreter (`python -m cuda_agent.cli ...` or the
package's module), so what the supervisor runs is exactly what a user would run by hand on another host.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path
from typing import Any, Sequence

from cuda_agent.supervisor import ProcessSpec

REPO_ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cache_root(configured: str = "") -> Path:
    """Caches shared by runs (torch.compile / inductor artefacts, sandbox builds): `configured`, else
    $XDG_CACHE_HOME/cuda-agent or ~/.cache/cuda-agent."""
    if configured:
        return Path(configured).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "cuda-agent"


def child_env(cpu_threads: int | None = None, jax_memory_fraction: float | None = None) -> dict[str, str]:
    """Environment every child gets: the repository on PYTHONPATH (so a source checkout works uninstalled); on
    CPU, optionally bounded thread pools; on a shared GPU, JAX's share of its memory (no preallocation beyond)."""
    env = {"PYTHONPATH": os.pathsep.join([str(REPO_ROOT)] + ([os.environ["PYTHONPATH"]]
                                                             if os.environ.get("PYTHONPATH") else [])),
           "PYTHONUNBUFFERED": "1"}
    if cpu_threads:
        env.update({"OMP_NUM_THREADS": str(cpu_threads), "MKL_NUM_THREADS": str(cpu_threads)})
    if jax_memory_fraction is not None:
        env.update({"XLA_PYTHON_CLIENT_MEM_FRACTION": f"{jax_memory_fraction:.3f}"})
    return env


def sandbox_env(cache_dir: Path) -> dict[str, str]:
    """Environment of the sandbox node and of the prewarm of its baselines: the inductor cache (torch.compile
    baselines) under `cache_dir`, so later runs reuse it, compiled with one thread (the same cache keys in both)."""
    env = child_env()
    env.update({"TORCHINDUCTOR_CACHE_DIR": str(cache_dir / "inductor"), "TORCHINDUCTOR_COMPILE_THREADS": "1"})
    return env


def prewarm_spec(name: str, config_yaml: Path, task_files: Sequence[Path], device: str, cache_dir: Path,
                 out: Path, deadline_s: float, niceness: int = 10) -> ProcessSpec:
    """`python -m sandbox.prewarm CONFIG TASKS...` at a lower CPU priority (`--nice`): it compiles the tasks'
    torch.compile baselines into the node's inductor cache while the cores are otherwise busy with training, and
    starts no task after `deadline_s`."""
    argv = [sys.executable, "-m", "sandbox.prewarm", str(config_yaml), *map(str, task_files), "--device", device,
            "--out", str(out), "--deadline-s", f"{deadline_s:g}", "--nice", str(niceness)]
    return ProcessSpec(name=name, argv=argv, env=sandbox_env(cache_dir), cwd=str(REPO_ROOT), restart=False,
                       stop_timeout_s=10.0)


def sandbox_node_spec(name: str, config_yaml: Path, endpoint: str, ready_file: Path, cache_dir: Path,
                      overrides: Sequence[str] = (), restart: bool = True, max_restarts: int = 5,
                      stop_timeout_s: float = 60.0) -> ProcessSpec:
    """`cuda-agent sandbox serve CONFIG endpoint=... ready_file=...`; the inductor cache (torch.compile baselines)
    lives under `cache_dir` so that later runs reuse it."""
    argv = [sys.executable, "-m", "cuda_agent.cli", "sandbox", "serve", str(config_yaml), f"endpoint={endpoint}",
            f"ready_file={ready_file}", *overrides]
    return ProcessSpec(name=name, argv=argv, env=sandbox_env(cache_dir), cwd=str(REPO_ROOT), restart=restart,
                       max_restarts=max_restarts,
                       restart_on_exit_0=restart, stop_timeout_s=stop_timeout_s, ready_file=str(ready_file))


def eval_args(cfg: Any, policy: str | Path, tasks: str | Path, out: str | Path, fmt: str, *,
              samples: int | None = None, temperature: float | None = None) -> list[str]:
    """`cuda-agent eval` arguments that evaluate `policy` on the tasks file `tasks` as the run of config `cfg`
    (cuda_agent.train_config.TrainConfig) evaluates: its evaluation settings (cfg.eval: turns, mode, token budgets),
    solution format `fmt`, seed, agent skill and the sampler's dtype and attention; `samples` and `temperature`
    replace cfg.eval's. Results go to the folder `out`. The caller adds where the sandbox is (`--sandbox` or
    `--sandbox-workers`) and anything else (`--tag`, `--concurrency`)."""
    e = cfg.eval
    args = ["--checkpoint", str(policy), "--tasks", str(tasks),
            "--samples", str(e.samples_per_task if samples is None else samples),
            "--temperature", str(e.temperature if temperature is None else temperature),
            "--max-turns", str(e.max_turns), "--max-new-tokens", str(e.max_new_tokens_per_turn),
            "--max-context-tokens", str(e.max_context_tokens), "--format", fmt, "--out", str(out),
            "--seed", str(cfg.seed), "--quiet", f"agent.skill={cfg.actor.agent.skill}",
            f"model_dtype={cfg.model.dtype}", f"attention_impl={cfg.model.attention_impl}"]
    if e.mode == "multi_turn":
        args.append("--multi-turn")
    if cfg.actor.agent.verify_on_finish:  # multi-turn evaluation episodes act as the run's actors do
        args.append("agent.verify_on_finish=true")
    return args


def eval_spec(name: str, args: Sequence[str], cpu_threads: int | None = None,
              jax_memory_fraction: float | None = None) -> ProcessSpec:
    """`cuda-agent eval ARGS` as a child (not restarted: the driver retries a failed evaluation itself)."""
    return ProcessSpec(name=name, argv=[sys.executable, "-m", "cuda_agent.cli", "eval", *args],
                       env=child_env(cpu_threads, jax_memory_fraction), cwd=str(REPO_ROOT), restart=False,
                       stop_timeout_s=30.0)
