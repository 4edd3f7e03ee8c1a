"""Fleet stress test (`cuda-agent sandbox stress`): offer load to sandbox nodes and measure what they take.

Load: jobs drawn (seeded) from a corpus of solutions by kind, in a configurable mix: correct fast (`fast`),
correct slow (`slow`), `wrong`, crashing (`crash`), hanging (`hang`) and `hostile` (tests/service/data/hostile:
solutions that attack the sandbox). Each job gets a fresh `cache_salt` (unless `reuse=True`), so the nodes
evaluate it instead of answering from their result store.

Modes:
- **fixed rate** (open loop): job i is due at t0 + i / rate (or at Poisson arrival times). Its latency is measured
  from that intended send time, not from when it was actually sent, so a node that stalls the sender cannot
  hide its queueing (no coordinated omission). Submission never blocks (the client is asynchronous).
- **fixed concurrency** (closed loop): `concurrency` jobs in flight at all times; latency from the send.
Either for `duration_s` or for `jobs` jobs. Latencies go into HDR histograms (hdrhistogram, microseconds,
3 significant digits): end to end, queueing delay at the node (stage `queue`), and each stage the node reports.

Sweep: steps of fixed rate, rising geometrically, each `step_duration_s` long. A step is *broken* when its p99
latency exceeds `knee_latency_factor` x the first step's p99, its error fraction exceeds `knee_error_fraction`,
or its throughput falls below `knee_throughput_fraction` x the offered rate. The knee is the highest offered rate
before the first broken step; the sweep stops `steps_after_knee` steps after it.

Per step the report gives throughput (completed jobs per second) and evaluations per hour, p50 / p95 / p99 /
max latency end to end and per stage, status counts by kind, client errors and "busy" replies, worker restarts,
worker busy fraction and GPU busy fraction (from the nodes' heartbeat counters, over the step), and the Little's
law check: the mean number of jobs in flight (sampled every 50 ms) against throughput x mean latency.
Reports: markdown, PNG (latency against offered load for a sweep; latency against time otherwise) and JSON
(sandbox.stress_report).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import logging
import random
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Sequence

from hdrh.histogram import HdrHistogram

from protocol.sandbox_jobs import SandboxJob
from sandbox.client import SandboxClient, SandboxClientError

log = logging.getLogger("sandbox.stress")

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CORPUS = REPO_ROOT / "tests" / "data" / "corpus"
DEFAULT_HOSTILE = REPO_ROOT / "tests" / "service" / "data" / "hostile"
KINDS = ("fast", "slow", "wrong", "crash", "hang", "hostile")
DEFAULT_MIX = {"fast": 0.45, "slow": 0.15, "wrong": 0.15, "crash": 0.1, "hang": 0.05, "hostile": 0.1}
HIST_STAGES = ("queue", "prebuild", "build", "reference", "candidate_start", "load", "verify", "profile",
               "timing_lock_wait", "total", "node")
_MAX_US = 24 * 3600 * 10**6


# ------------------------------------------------------------------------------------------------ corpus
@dataclasses.dataclass(frozen=True)
class Solution:
    """One solution of the corpus: its task (as a plain dict), files, format and kind."""

    kind: str
    name: str
    task: dict[str, Any]
    files: dict[str, str]
    format: str


def _read_task(task_dir: Path) -> dict[str, Any]:
    from tasks.schema import Task

    meta = json.loads((task_dir / "task.json").read_text())
    return Task(reference=(task_dir / "model.py").read_text(), **meta).to_dict()


def _read_files(d: Path) -> dict[str, str]:
    return {str(p.relative_to(d)): p.read_text() for p in sorted(d.rglob("*")) if p.is_file()
            and "__pycache__" not in p.parts}


def load_corpus(corpus: str | Path = DEFAULT_CORPUS, fmt: str = "cpu", hostile: str | Path | None = DEFAULT_HOSTILE,
                tasks: Sequence[str] | None = None) -> dict[str, list[Solution]]:
    """Solutions by kind. Layout: <corpus>/<task>/{task.json, model.py, <fmt>/<kind>/...} and
    <hostile>/<task>/<fmt>/<name>/... (the task itself is read from the corpus). Raises FileNotFoundError when
    nothing is found."""
    corpus = Path(corpus)
    out: dict[str, list[Solution]] = collections.defaultdict(list)
    task_dicts: dict[str, dict[str, Any]] = {}
    for task_dir in sorted(p for p in corpus.iterdir() if (p / "task.json").is_file()):
        if tasks and task_dir.name not in tasks:
            continue
        task_dicts[task_dir.name] = _read_task(task_dir)
        fdir = task_dir / fmt
        if not fdir.is_dir():
            continue
        for kdir in sorted(p for p in fdir.iterdir() if p.is_dir()):
            if kdir.name in KINDS:
                out[kdir.name].append(Solution(kdir.name, f"{task_dir.name}/{kdir.name}", task_dicts[task_dir.name],
                                               _read_files(kdir), fmt))
    if hostile is not None and Path(hostile).is_dir():
        for task_dir in sorted(p for p in Path(hostile).iterdir() if p.is_dir()):
            if task_dir.name not in task_dicts or not (task_dir / fmt).is_dir():
                continue
            for sdir in sorted(p for p in (task_dir / fmt).iterdir() if p.is_dir()):
                out["hostile"].append(Solution("hostile", f"{task_dir.name}/hostile/{sdir.name}",
                                               task_dicts[task_dir.name], _read_files(sdir), fmt))
    if not out:
        raise FileNotFoundError(f"no {fmt} solutions under {corpus}")
    return dict(out)


def parse_mix(text: str) -> dict[str, float]:
    """"fast=4,slow=1,hang=0" -> weights by kind. Raises ValueError naming an unknown kind or a bad weight."""
    mix: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        kind, _, w = part.partition("=")
        if kind not in KINDS:
            raise ValueError(f"mix: unknown kind {kind!r} (kinds: {', '.join(KINDS)})")
        try:
            mix[kind] = float(w)
        except ValueError:
            raise ValueError(f"mix: weight of {kind!r} must be a number, got {w!r}") from None
        if mix[kind] < 0:
            raise ValueError(f"mix: weight of {kind!r} must be >= 0")
    if not mix or sum(mix.values()) <= 0:
        raise ValueError("mix: give at least one kind with a positive weight")
    return mix


# ------------------------------------------------------------------------------------------------ config
@dataclasses.dataclass
class StressConfig:
    """What load to offer. Fields (defaults in parentheses):"""

    mode: str = "concurrency"
    """"rate" (open loop, fixed arrival rate) or "concurrency" (closed loop)."""
    rate_per_s: float = 1.0
    """Offered jobs per second in rate mode."""
    arrivals: str = "uniform"
    """Rate mode: "uniform" (evenly spaced) or "poisson" arrival times."""
    concurrency: int = 4
    """Jobs in flight in concurrency mode."""
    duration_s: float = 0.0
    """Offer load for this long (0: use `jobs`)."""
    jobs: int = 20
    """Number of jobs when duration_s is 0."""
    mix: dict[str, float] = dataclasses.field(default_factory=lambda: dict(DEFAULT_MIX))
    """Weights of the kinds (kinds missing from the corpus are left out)."""
    settings: dict[str, Any] = dataclasses.field(default_factory=dict)
    """SandboxJob.settings for every job (e.g. {"use_compile": False})."""
    priority: int = 1
    """SandboxJob.priority (0 evaluation, 1 training)."""
    deadline_s: float = 600.0
    """SandboxJob.deadline_s: the client gives up on a job after this long."""
    reuse: bool = False
    """Let nodes answer repeated solutions from memory (False: a fresh cache salt per job)."""
    seed: int = 0
    """Seed of the job mix and Poisson arrivals."""
    drain_s: float = 0.0
    """After the last send, wait at most this long for outstanding jobs (0: deadline_s)."""

    def __post_init__(self) -> None:
        if self.mode not in ("rate", "concurrency"):
            raise ValueError(f"StressConfig.mode must be 'rate' or 'concurrency', got {self.mode!r}")
        if self.arrivals not in ("uniform", "poisson"):
            raise ValueError(f"StressConfig.arrivals must be 'uniform' or 'poisson', got {self.arrivals!r}")
        if self.mode == "rate" and not self.rate_per_s > 0:
            raise ValueError("StressConfig.rate_per_s must be > 0")
        if self.mode == "concurrency" and self.concurrency < 1:
            raise ValueError("StressConfig.concurrency must be >= 1")
        if self.duration_s < 0 or (self.duration_s == 0 and self.jobs < 1):
            raise ValueError("StressConfig: give duration_s > 0 or jobs >= 1")


@dataclasses.dataclass
class SweepConfig:
    """A rate sweep. Fields: rates (explicit offered rates, jobs/s; empty = start x factor^k for k < steps),
    start_rate_per_s, factor, steps, step_duration_s, and the knee rules (see the module doc)."""

    rates: list[float] = dataclasses.field(default_factory=list)
    start_rate_per_s: float = 0.1
    factor: float = 1.5
    steps: int = 8
    step_duration_s: float = 60.0
    knee_latency_factor: float = 3.0
    knee_error_fraction: float = 0.05
    knee_throughput_fraction: float = 0.85
    steps_after_knee: int = 1

    def rate_list(self) -> list[float]:
        if self.rates:
            return sorted(float(r) for r in self.rates)
        return [self.start_rate_per_s * self.factor ** k for k in range(self.steps)]


# ------------------------------------------------------------------------------------------------ one run
@dataclasses.dataclass
class JobRecord:
    index: int
    kind: str
    solution: str
    intended_s: float        # when it was due (monotonic, relative to the run's start)
    sent_s: float
    done_s: float = -1.0
    status: str = ""         # EvalResult status, or "error:<code>" when no result came back
    reward: float | None = None
    node: str = ""
    stage_ms: dict[str, float] = dataclasses.field(default_factory=dict)
    contended: bool = False

    @property
    def latency_ms(self) -> float:
        return (self.done_s - self.intended_s) * 1e3


def _hist() -> HdrHistogram:
    return HdrHistogram(1, _MAX_US, 3)


def _pcts(h: HdrHistogram) -> dict[str, float]:
    if h.get_total_count() == 0:
        return {"count": 0}
    return {"count": h.get_total_count(), "p50_ms": h.get_value_at_percentile(50) / 1e3,
            "p95_ms": h.get_value_at_percentile(95) / 1e3, "p99_ms": h.get_value_at_percentile(99) / 1e3,
            "max_ms": h.get_max_value() / 1e3, "mean_ms": h.get_mean_value() / 1e3}


def _node_snapshot(client: SandboxClient) -> dict[str, dict[str, Any]]:
    return {a: dict(n["status"], _t=time.monotonic()) for a, n in client.nodes().items() if n["status"]}


def _node_deltas(before: dict[str, dict], after: dict[str, dict]) -> dict[str, Any]:
    """Worker restarts, worker busy fraction and GPU busy fraction over a window, summed over nodes."""
    restarts = 0
    busy_s = capacity_s = 0.0
    gpu_util = gpu_time = 0.0
    for addr, a in after.items():
        b = before.get(addr)
        if b is None:
            continue
        restarts += a.get("counts", {}).get("worker_restarts", 0) - b.get("counts", {}).get("worker_restarts", 0)
        dt = a["_t"] - b["_t"]
        busy_s += a.get("worker_busy_s", 0.0) - b.get("worker_busy_s", 0.0)
        capacity_s += dt * a.get("workers", 0)
        gpu_util += a.get("gpu_util_s", 0.0) - b.get("gpu_util_s", 0.0)
        gpu_time += a.get("gpu_time_s", 0.0) - b.get("gpu_time_s", 0.0)
    return {"worker_restarts": restarts,
            "worker_busy_fraction": busy_s / capacity_s if capacity_s > 0 else None,
            "gpu_busy_fraction": gpu_util / gpu_time if gpu_time > 0 else None}


class _Run:
    """One load run against a client (see `run_load`)."""

    def __init__(self, client: SandboxClient, corpus: dict[str, list[Solution]], cfg: StressConfig, label: str):
        self.client = client
        self.cfg = cfg
        self.label = label
        self.rng = random.Random(cfg.seed)
        mix = {k: w for k, w in cfg.mix.items() if w > 0 and corpus.get(k)}
        if not mix:
            raise ValueError(f"stress: none of the kinds in the mix {cfg.mix} is in the corpus ({sorted(corpus)})")
        self.kinds, self.weights = list(mix), list(mix.values())
        self.corpus = corpus
        self.records: list[JobRecord] = []
        self.lock = threading.Lock()
        self.outstanding = 0
        self.samples: list[int] = []
        self.errors: collections.Counter[str] = collections.Counter()
        self.run_id = uuid.uuid4().hex[:8]
        self.all_done = threading.Event()
        self.sending_done = False

    def _job(self, i: int) -> tuple[SandboxJob, Solution]:
        kind = self.rng.choices(self.kinds, self.weights)[0]
        sol = self.rng.choice(self.corpus[kind])
        job_id = f"stress-{self.run_id}-{self.label}-{i}"
        settings = dict(self.cfg.settings)
        if not self.cfg.reuse:
            settings["cache_salt"] = job_id
        return SandboxJob(job_id=job_id, task=sol.task, files=sol.files, format=sol.format, settings=settings,
                          priority=self.cfg.priority, deadline_s=self.cfg.deadline_s), sol

    def _send(self, i: int, intended: float, t0: float, on_done: Any = None) -> None:
        job, sol = self._job(i)
        rec = JobRecord(i, sol.kind, sol.name, intended - t0, time.monotonic() - t0)
        with self.lock:
            self.records.append(rec)
            self.outstanding += 1
        fut = self.client.submit(job)

        def done(f: Any) -> None:
            rec.done_s = time.monotonic() - t0
            err = f.exception()
            if err is None:
                r = f.result()
                rec.status, rec.node = r.status, r.node_id
                rec.reward = r.result.get("reward")
                rec.stage_ms = {k: float(v) for k, v in r.result.get("stage_ms", {}).items()}
                rec.contended = bool(r.result.get("contended", False))
            else:
                code = err.code if isinstance(err, SandboxClientError) else "internal"
                rec.status = f"error:{code}"
                with self.lock:
                    self.errors[code] += 1
            with self.lock:
                self.outstanding -= 1
                if self.sending_done and self.outstanding == 0:
                    self.all_done.set()
            if on_done is not None:
                on_done()

        fut.add_done_callback(done)

    def _sampler(self, stop: threading.Event) -> None:
        while not stop.wait(0.05):
            with self.lock:
                self.samples.append(self.outstanding)

    def run(self) -> dict[str, Any]:
        cfg = self.cfg
        busy0 = self.client.rpc.stats["busy"]
        resends0 = self.client.rpc.stats["resends"]
        nodes0 = _node_snapshot(self.client)
        stop = threading.Event()
        sampler = threading.Thread(target=self._sampler, args=(stop,), daemon=True)
        t0 = time.monotonic()
        sampler.start()
        if cfg.mode == "rate":
            self._offer_rate(t0)
        else:
            self._offer_concurrency(t0)
        send_end = time.monotonic() - t0
        with self.lock:
            self.sending_done = True
            if self.outstanding == 0:
                self.all_done.set()
        self.all_done.wait(cfg.drain_s or cfg.deadline_s + 60)
        t_end = time.monotonic() - t0
        stop.set()
        sampler.join()
        nodes1 = _node_snapshot(self.client)
        return self._summary(t_end, send_end, self.client.rpc.stats["busy"] - busy0,
                             self.client.rpc.stats["resends"] - resends0, _node_deltas(nodes0, nodes1))

    def _offer_rate(self, t0: float) -> None:
        cfg = self.cfg
        n_max = int(cfg.rate_per_s * cfg.duration_s) if cfg.duration_s > 0 else cfg.jobs
        arrival = 0.0
        for i in range(n_max):
            if i:
                arrival += self.rng.expovariate(cfg.rate_per_s) if cfg.arrivals == "poisson" else 1.0 / cfg.rate_per_s
            intended = t0 + arrival
            delay = intended - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            self._send(i, intended, t0)

    def _offer_concurrency(self, t0: float) -> None:
        cfg = self.cfg
        slots = threading.Semaphore(cfg.concurrency)
        end = t0 + cfg.duration_s if cfg.duration_s > 0 else None
        i = 0
        while (end is None and i < cfg.jobs) or (end is not None and time.monotonic() < end):
            if not slots.acquire(timeout=0.2):
                continue
            self._send(i, time.monotonic(), t0, on_done=slots.release)
            i += 1

    def _summary(self, t_end: float, send_end: float, busy: int, resends: int, nodes: dict[str, Any]
                 ) -> dict[str, Any]:
        cfg = self.cfg
        e2e = _hist()
        stages = {s: _hist() for s in HIST_STAGES}
        by_kind: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        done = [r for r in self.records if r.done_s >= 0]
        results = [r for r in done if not r.status.startswith("error:")]
        for r in done:
            by_kind[r.kind][r.status] += 1
        for r in results:
            e2e.record_value(max(1, min(_MAX_US, int(r.latency_ms * 1e3))))
            for s in HIST_STAGES:
                if s in r.stage_ms:
                    stages[s].record_value(max(1, min(_MAX_US, int(r.stage_ms[s] * 1e3))))
        first = min((r.intended_s for r in self.records), default=0.0)
        last = max((r.done_s for r in done), default=first)
        window = max(last - first, 1e-9)
        throughput = len(results) / window
        mean_lat_s = (sum(r.done_s - r.sent_s for r in results) / len(results)) if results else 0.0
        mean_in_flight = sum(self.samples) / len(self.samples) if self.samples else 0.0
        little = len(done) / window * ((sum(r.done_s - r.sent_s for r in done) / len(done)) if done else 0.0)
        offered = (cfg.rate_per_s if cfg.mode == "rate" else None)
        return {
            "label": self.label, "mode": cfg.mode, "offered_rate_per_s": offered, "concurrency": cfg.concurrency
            if cfg.mode == "concurrency" else None, "jobs_sent": len(self.records), "jobs_done": len(done),
            "results": len(results), "errors": dict(self.errors), "busy_replies": busy, "resends": resends,
            "window_s": window, "send_s": send_end, "throughput_per_s": throughput,
            "evaluations_per_hour": throughput * 3600,
            "latency_ms": _pcts(e2e), "stage_ms": {s: _pcts(h) for s, h in stages.items() if h.get_total_count()},
            "status_by_kind": {k: dict(v) for k, v in sorted(by_kind.items())},
            "contended": sum(r.contended for r in results),
            "little": {"mean_in_flight": mean_in_flight, "throughput_x_latency": little,
                       "ratio": (mean_in_flight / little) if little > 0 else None},
            "nodes": nodes,
            "records": [dataclasses.asdict(r) | {"latency_ms": r.latency_ms} for r in self.records],
        }


def run_load(client: SandboxClient, corpus: dict[str, list[Solution]], cfg: StressConfig, label: str = "run"
             ) -> dict[str, Any]:
    """Offer `cfg`'s load through `client`; returns the summary dict of the run (see the module doc)."""
    return _Run(client, corpus, cfg, label).run()


def broken(step: dict[str, Any], first: dict[str, Any], sweep: SweepConfig) -> list[str]:
    """Why a sweep step counts as past the knee ([] when it does not)."""
    why = []
    p99, p99_0 = step["latency_ms"].get("p99_ms"), first["latency_ms"].get("p99_ms")
    if p99 is not None and p99_0 and p99 > sweep.knee_latency_factor * p99_0:
        why.append(f"p99 {p99:.0f} ms > {sweep.knee_latency_factor:g} x {p99_0:.0f} ms")
    sent = max(1, step["jobs_sent"])
    err = sum(step["errors"].values()) / sent
    if err > sweep.knee_error_fraction:
        why.append(f"errors {err:.0%} > {sweep.knee_error_fraction:.0%}")
    offered = step["offered_rate_per_s"]
    if offered and step["throughput_per_s"] < sweep.knee_throughput_fraction * offered:
        why.append(f"throughput {step['throughput_per_s']:.3g}/s < {sweep.knee_throughput_fraction:g} x offered "
                   f"{offered:.3g}/s")
    if step["latency_ms"].get("count", 0) == 0:
        why.append("no results")
    return why


def run_sweep(client: SandboxClient, corpus: dict[str, list[Solution]], base: StressConfig, sweep: SweepConfig
              ) -> dict[str, Any]:
    """Step the offered rate up (see the module doc); returns {"steps": [...], "knee_rate_per_s",
    "saturation_throughput_per_s", "broken_at"}."""
    steps: list[dict[str, Any]] = []
    knee = None
    broken_at = None
    after = 0
    for k, rate in enumerate(sweep.rate_list()):
        cfg = dataclasses.replace(base, mode="rate", rate_per_s=rate, duration_s=sweep.step_duration_s,
                                  seed=base.seed + k)
        log.info("stress sweep: step %d, %.3g jobs/s for %.0f s", k, rate, sweep.step_duration_s)
        step = run_load(client, corpus, cfg, label=f"step{k}")
        step["broken"] = broken(step, steps[0] if steps else step, sweep) if steps else broken(step, step, sweep)
        steps.append(step)
        log.info("stress sweep: step %d done: %.3g jobs/s, p99 %s ms%s", k, step["throughput_per_s"],
                 step["latency_ms"].get("p99_ms"), f" (broken: {'; '.join(step['broken'])})" if step["broken"] else "")
        if step["broken"]:
            if broken_at is None:
                broken_at = rate
            after += 1
            if after > sweep.steps_after_knee:
                break
        elif broken_at is None:
            knee = rate
    return {"steps": steps, "knee_rate_per_s": knee, "broken_at_rate_per_s": broken_at,
            "saturation_throughput_per_s": max((s["throughput_per_s"] for s in steps), default=0.0)}


# ------------------------------------------------------------------------------------------------ local node
class LocalNode:
    """A sandbox node started as a subprocess on this machine (for `stress --local-node` and tests).

    Args: overrides (ServiceConfig key=value strings, e.g. ["workers=1", "sandbox.backend=cpu"]), log_path.
    """

    def __init__(self, overrides: Sequence[str] = (), log_path: str | Path | None = None, start_timeout_s: float = 240.0,
                 netns: str | None = None, wait: bool = True):
        self.tmp = Path(tempfile.mkdtemp(prefix="cuda-agent-node-"))
        self.ready_file = self.tmp / "ready.json"
        self.log_path = Path(log_path) if log_path else self.tmp / "node.log"
        args = ["endpoint=tcp://127.0.0.1:0", "metrics_port=0", *overrides, f"ready_file={self.ready_file}"]
        self.ready_file.unlink(missing_ok=True)
        cmd = [sys.executable, "-m", "sandbox.service", *args]
        if netns:
            cmd = ["ip", "netns", "exec", netns, *cmd]
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        self.start_timeout_s = start_timeout_s
        self.info: dict[str, Any] = {}
        self.endpoint = ""
        if wait:
            self.wait_ready()

    def wait_ready(self) -> "LocalNode":
        """Wait for the node's ready file (every worker up). Raises RuntimeError when it exits or takes too long."""
        deadline = time.monotonic() + self.start_timeout_s
        while not self.ready_file.exists():
            if self.proc.poll() is not None:
                raise RuntimeError(f"sandbox node exited with {self.proc.returncode}: "
                                   f"{self.log_path.read_text()[-3000:]}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"sandbox node not ready within {self.start_timeout_s:.0f} s")
            time.sleep(0.1)
        self.info = json.loads(self.ready_file.read_text())
        self.endpoint = self.info["endpoint"]
        return self

    def stop(self, timeout_s: float = 60.0) -> int | None:
        """SIGTERM (drain) and wait; SIGKILL when it does not exit in time. Returns the exit code."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL the node (its workers die with it)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def __enter__(self) -> "LocalNode":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


# ------------------------------------------------------------------------------------------------ whole test
def run_stress(client: SandboxClient, corpus: dict[str, list[Solution]], load: StressConfig,
               sweep: SweepConfig | None = None, out_dir: str | Path | None = None) -> tuple[dict[str, Any], dict]:
    """A single run (`sweep` None) or a sweep; writes the reports when `out_dir` is given.

    Returns (report, {"markdown", "png", "json"} paths or {}).
    """
    report: dict[str, Any] = {
        "kind": "sweep" if sweep is not None else "run",
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "endpoints": list(client.endpoints),
        "config": {"load": dataclasses.asdict(load), "sweep": dataclasses.asdict(sweep) if sweep else None},
        "corpus": {k: len(v) for k, v in sorted(corpus.items())},
        "nodes": {a: n["status"] for a, n in client.nodes().items()},
    }
    if sweep is not None:
        report["sweep"] = run_sweep(client, corpus, load, sweep)
    else:
        report["run"] = run_load(client, corpus, load)
    paths: dict = {}
    if out_dir is not None:
        from sandbox.stress_report import write_reports

        paths = write_reports(report, out_dir)
    return report, paths
