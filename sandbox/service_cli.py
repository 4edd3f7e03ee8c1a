"""`cuda-agent sandbox serve` and `cuda-agent sandbox stress` (mounted on the sandbox sub-app in sandbox/cli.py).

    cuda-agent sandbox serve [CONFIG.yaml] [key=value ...] [--init-keys DIR]
    cuda-agent sandbox stress (--endpoint tcp://host:5557 ... | --local-node) [--rate R | --concurrency C]
        [--duration S | --jobs N] [--mix fast=4,slow=1,...] [--sweep ...] [--out DIR]

Thin wrappers over sandbox.service and sandbox.stress; nothing heavy is imported until a command runs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer


def _fail(msg: str) -> None:
    from rich.console import Console

    Console(stderr=True, soft_wrap=True).print(f"[red]error:[/red] {msg}")
    raise typer.Exit(2)


def serve_cmd(
    args: Optional[List[str]] = typer.Argument(None, help="[CONFIG.yaml] then ServiceConfig overrides key=value "
                                               "(e.g. endpoint=tcp://*:5557 workers=2 sandbox.backend=cpu)."),
    init_keys: Optional[Path] = typer.Option(None, help="Write CURVE keys for a node and one client into DIR, "
                                             "print the settings to use, and exit."),
) -> None:
    """Serve sandbox jobs (build, verify, profile, reward) to actors over ZeroMQ until SIGTERM (then drain)."""
    import logging

    from cuda_agent.config import ConfigError, config_path_and_overrides, load_config
    from protocol.auth import init_keys as make_keys
    from sandbox.service import ServiceConfig, run_node

    if init_keys is not None:
        paths = make_keys(init_keys)
        typer.echo(f"node:   curve_secret_key={paths['server_secret_key']} "
                   f"curve_authorized_keys={paths['authorized_keys']}")
        typer.echo(f"client: curve_secret_key={paths['client_client_secret_key']} "
                   f"server_public_key={paths['server_public_key']}")
        return
    path, items = config_path_and_overrides(args or [])
    try:
        cfg = load_config(ServiceConfig, path, items)
    except (ConfigError, ValueError, FileNotFoundError) as e:
        _fail(str(e))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        code = run_node(cfg)
    except ValueError as e:
        _fail(str(e))
    raise typer.Exit(code)


def _settings(items: List[str]) -> dict:
    out = {}
    for it in items:
        k, sep, v = it.partition("=")
        if not sep:
            _fail(f"--setting {it!r} is not key=value")
        try:
            out[k] = json.loads(v)
        except ValueError:
            out[k] = v
    return out


def stress_cmd(
    endpoint: Optional[List[str]] = typer.Option(None, "--endpoint", "-e", help="Node address (repeat for many)."),
    local_node: bool = typer.Option(False, help="Start a node on this machine (CPU backend unless --node-opt says "
                                    "otherwise) and stress it."),
    node_opt: Optional[List[str]] = typer.Option(None, help="ServiceConfig override for --local-node (repeat)."),
    rate: Optional[float] = typer.Option(None, help="Fixed rate, jobs/s (open loop; latency from intended send)."),
    concurrency: Optional[int] = typer.Option(None, help="Fixed concurrency (closed loop). Default 4."),
    duration: float = typer.Option(0.0, help="Seconds of load (0: use --jobs)."),
    jobs: int = typer.Option(20, help="Jobs to send when --duration is 0."),
    mix: str = typer.Option("fast=45,slow=15,wrong=15,crash=10,hang=5,hostile=10", help="Weights by kind."),
    fmt: str = typer.Option("cpu", "--format", help="Solution format of the corpus: cpu, cubin or extension."),
    corpus: Optional[Path] = typer.Option(None, help="Corpus folder (default tests/data/corpus)."),
    hostile: Optional[Path] = typer.Option(None, help="Hostile solutions (default tests/service/data/hostile)."),
    task: Optional[List[str]] = typer.Option(None, help="Only these corpus tasks (repeat)."),
    setting: Optional[List[str]] = typer.Option(None, help="Job setting key=value (repeat), e.g. use_compile=false."),
    priority: int = typer.Option(1, help="Job priority: 0 evaluation, 1 training."),
    deadline: float = typer.Option(600.0, help="Job deadline, seconds."),
    reuse: bool = typer.Option(False, help="Let nodes answer repeated solutions from memory."),
    seed: int = typer.Option(0),
    sweep: bool = typer.Option(False, help="Step the offered rate up until latency or errors break away."),
    rates: Optional[str] = typer.Option(None, help="Sweep rates, comma-separated jobs/s (default start x factor^k)."),
    start_rate: float = typer.Option(0.1, help="Sweep: first rate, jobs/s."),
    factor: float = typer.Option(1.5, help="Sweep: rate factor per step."),
    steps: int = typer.Option(8, help="Sweep: most steps."),
    step_duration: float = typer.Option(60.0, help="Sweep: seconds per step."),
    out: Path = typer.Option(Path("stress-report"), help="Folder for stress.md, stress.png, stress.json."),
    curve_secret_key: Optional[Path] = typer.Option(None, help="Client CURVE secret key file."),
    server_public_key: Optional[Path] = typer.Option(None, help="Node CURVE public key file."),
) -> None:
    """Offer load to sandbox nodes from the corpus and report throughput, latency (HDR) and the knee."""
    import logging

    from sandbox.client import SandboxClient
    from sandbox.stress import (DEFAULT_CORPUS, DEFAULT_HOSTILE, LocalNode, StressConfig, SweepConfig, load_corpus,
                                parse_mix, run_stress)

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if rate is not None and concurrency is not None:
        _fail("give --rate or --concurrency, not both")
    try:
        load = StressConfig(mode="rate" if rate is not None else "concurrency", rate_per_s=rate or 1.0,
                            concurrency=concurrency or 4, duration_s=duration, jobs=jobs, mix=parse_mix(mix),
                            settings=_settings(setting or []), priority=priority, deadline_s=deadline, reuse=reuse,
                            seed=seed)
        sw = SweepConfig(rates=[float(r) for r in rates.split(",")] if rates else [], start_rate_per_s=start_rate,
                         factor=factor, steps=steps, step_duration_s=step_duration) if sweep else None
        solutions = load_corpus(corpus or DEFAULT_CORPUS, fmt, hostile or DEFAULT_HOSTILE, task or None)
    except (ValueError, FileNotFoundError) as e:
        _fail(str(e))
    node = None
    endpoints = list(endpoint or [])
    if local_node:
        opts = list(node_opt or [])
        if not any(o.startswith("sandbox.backend=") for o in opts):
            opts.append("sandbox.backend=cpu")
        out.mkdir(parents=True, exist_ok=True)
        node = LocalNode(opts, log_path=out / "node.log")
        endpoints.append(node.endpoint)
    if not endpoints:
        _fail("give at least one --endpoint, or --local-node")
    try:
        keys = {"curve_secret_key": curve_secret_key, "server_public_key": server_public_key} \
            if curve_secret_key else {}
        with SandboxClient(endpoints, client_id="stress", **keys) as client:
            if not client.wait_for_nodes(1, timeout_s=120):
                _fail(f"no node answered at {endpoints}")
            report, paths = run_stress(client, solutions, load, sw, out)
    finally:
        if node is not None:
            node.stop()
    typer.echo((paths["markdown"]).read_text())
    typer.echo(f"reports: {paths['markdown']}, {paths['png']}, {paths['json']}")
