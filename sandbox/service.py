"""The sandbox node service (`cuda-agent sandbox serve`): serves `SandboxJob`s to a fleet of actors.

    clients ──SandboxJob──> RpcServer (ROUTER, protocol.rpc) ──handler──> admission ──> JobQueue (bounded)
                                │ heartbeats carry {"free", "queued", ...}      │            │
                                │                                               │       build pool (threads:
                                │                                               │       host compiler / nvcc,
                                │                                               │       warms the build cache)
                                └──<── SandboxResult / Error(busy) ─────────────┘            │
                                                                          slot threads ──> worker processes
                                                                          (one per GPU; CPU backend: N)
                                                                          each owns an Evaluator

Admission (in the RPC loop thread, quick):
  1. a draining node answers `Error(busy)`, so the client moves the job to another node;
  2. a job id seen before is answered from the `ResultStore` (or joins the running job with that id): a resent
     job is never run twice;
  3. the task, format and settings are checked; a bad one gets `Error(bad_message, field=...)`;
  4. the content key, sha256 of (task, solution files, format, evaluation settings, cache salt), finds a
     finished result of the same content (answered at once) or a running one (joined);
  5. a full queue (checked before step 3, so refusing stays cheap under overload), or an estimated wait past
     the job's deadline, gets `Error(busy, retry_after_s=...)`: backpressure instead of memory growth;
  6. otherwise the job is queued: priority first (0 evaluation, 1+ training), then earliest deadline, then
     arrival. Its build is queued on the build pool at once.
A slot thread takes the next job, drops it if its deadline has passed (`Error(gone)`), waits for its build,
and sends it to its worker process with a time bound. A worker that dies or hangs is killed and replaced
(`worker_restarts`); its job goes back to the head of the queue, and a job that has lost
`max_worker_failures` workers is answered `internal_error` (poisoned) instead of being retried forever. Only
losses after the job reached the worker count: a worker found dead when its job arrives (killed while idle, or
while the job waited for its prebuild) is replaced and the job runs on the new one; after 2 x
`max_worker_failures` + 1 such finds the job is answered `internal_error` (the node's workers keep dying), or
earlier when its deadline passes.
An `internal_error` result (the sandbox's fault, e.g. a candidate process that could not start on an
overloaded host) is evaluated again `internal_error_retries` times before it is answered.

Timing on a GPU holds the device's timing lock (sandbox.service_lock) exclusively around an evaluation's timed
sections (calibration, profile) and shared around its untimed GPU work (reference stage, verification), so a
sampler or another worker on the GPU runs beside everything but the timing; a result timed without it is flagged
`contended` and is not reused for other jobs.

Shutdown: SIGTERM or SIGINT drains: new jobs and queued jobs get `Error(busy)` (clients resend them
elsewhere), running jobs finish and are answered, then the node exits. A second signal exits at once.

Security: binding beyond loopback turns CURVE on (ZAP with a folder of authorised client keys) unless the
configuration says `curve=never`; plain loopback needs no keys.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import json
import logging
import math
import os
import re
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any, Sequence

from protocol.auth import CURVE_MODES, CurveServer, is_loopback, server_curve
from protocol.handshake import Error
from protocol.rpc import RpcRequest, RpcServer
from protocol.sandbox_jobs import SandboxJob, SandboxResult
from sandbox.config import SandboxConfig
from sandbox.evaluator import check_format
from sandbox.result import EvalResult, Status
from sandbox.service_admission import DeviceLedger, TaskFootprints, gpu_memory_bytes, out_of_memory, task_footprint_key
from sandbox.service_lock import DEFAULT_LOCK_DIR, gpu_device_key
from sandbox.service_metrics import NodeMetrics
from sandbox.service_queue import JobQueue, QueuedJob, ResultStore
from sandbox.service_worker import WorkerLost, WorkerProcess
from tasks.schema import Task

log = logging.getLogger("sandbox.service")

#: SandboxConfig fields a job may set in `SandboxJob.settings` (they change how a solution is checked and timed,
#: not where or how it is confined). Time limits may only be lowered below the node's own.
EVAL_SETTINGS = ("build_only", "num_trials", "atol", "rtol", "poison_outputs", "check_timed_outputs", "profile", "use_compile",
                 "compile_mode", "warmup_calls", "reps", "early_stop_reps", "early_stop_level", "min_rep_ms", "max_calls_per_rep", "bootstrap_samples",
                 "ci_level", "faster_than_eager", "faster_than_compile", "top_margin", "l2_flush_bytes",
                 "timing_gate", "timing_gate_extension", "timing_gate_flush",
                 "cpu_threads", "build_timeout_s", "extension_build_timeout_s", "load_timeout_s", "trial_timeout_s",
                 "profile_timeout_s", "reference_timeout_s")
TIME_LIMITS = tuple(s for s in EVAL_SETTINGS if s.endswith("_timeout_s"))
#: Settings key that only enters the content key: a caller forces a fresh measurement with a new salt (e.g. to
#: re-measure a `contended` reward).
CACHE_SALT = "cache_salt"


@dataclasses.dataclass
class ServiceConfig:
    """Configuration of one sandbox node (`cuda-agent sandbox serve`). Fields (defaults in parentheses):"""

    endpoint: str = "tcp://127.0.0.1:5557"
    """Where the ROUTER binds ("tcp://*:5557" to serve other hosts: CURVE is then on unless curve=never)."""
    node_id: str = ""
    """Name in results and logs; "" = <hostname>-<pid>."""
    workers: int = 0
    """Verify/profile worker processes; 0 = one per GPU (cuda backend), half the cores, at least 1 (cpu). More
    than one per GPU shares each card's memory: the jobs then reserve device memory (`memory_admission`), and one
    that runs out of it beside another job, with the trusted side's evidence, is evaluated again alone
    (sandbox.service_admission)."""
    gpus: str = ""
    """cuda backend: comma-separated CUDA_VISIBLE_DEVICES entries to serve; "" = every visible GPU."""
    build_workers: int = -1
    """Build-pool threads that compile queued jobs ahead of the workers; -1 = cores left over, 1..8; 0 = off."""
    queue_max: int = 64
    """Jobs that may wait; more get Error(busy)."""
    busy_retry_after_s: float = 0.25
    """Least retry_after_s in busy replies (the node adds its estimate of the wait)."""
    result_cache_bytes: int = 64 * 1024 * 1024
    """Bound on finished results kept in memory (packed), by content and by job id."""
    reuse_results: bool = True
    """Answer a job whose content key matches a finished job from memory (False: only resent job ids)."""
    job_ids_kept: int = 100_000
    """Job ids remembered (LRU)."""
    job_id_keep_s: float = 3600.0
    """How long a job id is remembered, seconds."""
    max_worker_failures: int = 2
    """A job that has lost this many workers is answered internal_error (poisoned) instead of retried."""
    internal_error_retries: int = 1
    """An internal_error result (the sandbox's fault, e.g. a candidate process that could not start on an
    overloaded host) is evaluated again this many times before it is answered."""
    evaluators_per_worker: int = 3
    """Evaluators a worker keeps, one per distinct job settings (LRU). 3 fits the agent loop's stages: build_only
    (no trusted worker), profile off (verify) and the node's own settings (profile, final reward)."""
    worker_start_timeout_s: float = 180.0
    """How long a worker may take to come up."""
    timing_lock: str = "auto"
    """"auto" (the cuda backend: yes), "always", "never": hold the device's timing lock while timing (exclusive) and while verifying (shared)."""
    timing_lock_dir: str = DEFAULT_LOCK_DIR
    """Folder of the lock files (tmpfs; shared by every GPU user on the host)."""
    timing_lock_timeout_s: float = 10.0
    """Wait at most this long for the lock; then time anyway and flag the result `contended`."""
    cpu_lock_key: str = "cpu"
    """Lock key used on the cpu backend when timing_lock=always."""
    curve: str = "auto"
    """"auto" (on when binding beyond loopback), "always", "never" (serve beyond loopback unauthenticated)."""
    curve_secret_key: str = ""
    """The node's CURVE secret key file (`<name>.key_secret`, see `sandbox serve --init-keys`)."""
    curve_authorized_keys: str = ""
    """Folder of the public key files of the clients allowed in."""
    metrics_port: int = 9464
    """Prometheus endpoint port; 0 = any free port (logged and in the ready file); -1 = off."""
    metrics_addr: str = ""
    """Prometheus endpoint address; "" = 127.0.0.1 for a loopback endpoint, else 0.0.0.0."""
    log_interval_s: float = 30.0
    """Seconds between metrics log lines."""
    drain_timeout_s: float = 900.0
    """On SIGTERM, wait at most this long for running jobs."""
    ready_file: str = ""
    """Write {"endpoint", "metrics_port", "pid", ...} as JSON here once every worker is up ("" = none)."""
    memory_admission: bool = True
    """Several workers per GPU: a job starts only when the device memory its task needs (`job_memory_factor` x the
    trusted worker's measured peak for the task) fits beside the jobs running on its GPU; and a job whose result
    reports a device out-of-memory error before the profile while its GPU was shared, with the trusted worker's
    reading of free device memory below `oom_free_fraction`, is evaluated again alone (sharing the
    internal_error_retries budget). False: neither (a candidate can then be answered runtime_error for its
    neighbours' memory). The CPU backend has neither."""
    gpu_memory_fraction: float = 0.9
    """Share (0, 1] of each GPU's memory (NVML total) the running jobs may reserve in all; the rest is for CUDA
    contexts and the GPU's other users."""
    job_memory_factor: float = 2.0
    """A job reserves this many times its task's trusted-side device peak (EvalResult.device_peak_bytes): the
    candidate's process holds about as much again (inputs, outputs, its own intermediates)."""
    oom_free_fraction: float = 0.25
    """An out-of-memory answer counts as the neighbours' doing only when the trusted worker found less than this
    share (0, 1] of the GPU's memory free right after the failure (EvalResult.device_free_fraction)."""
    sandbox: SandboxConfig = dataclasses.field(default_factory=SandboxConfig)
    """The build / verify / profile configuration every job starts from."""

    def __post_init__(self) -> None:
        if not re.match(r"^(tcp|ipc|inproc)://", self.endpoint):
            raise ValueError(f"ServiceConfig.endpoint must be tcp://, ipc:// or inproc://, got {self.endpoint!r}")
        for name, lo in (("workers", 0), ("queue_max", 1), ("max_worker_failures", 1), ("internal_error_retries", 0), ("evaluators_per_worker", 1),
                         ("job_ids_kept", 1), ("result_cache_bytes", 0), ("build_workers", -1), ("metrics_port", -1)):
            if getattr(self, name) < lo:
                raise ValueError(f"ServiceConfig.{name} must be >= {lo}, got {getattr(self, name)}")
        for name in ("gpu_memory_fraction", "oom_free_fraction"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"ServiceConfig.{name} must be in (0, 1], got {getattr(self, name)}")
        if not (math.isfinite(self.job_memory_factor) and self.job_memory_factor > 0):
            raise ValueError(f"ServiceConfig.job_memory_factor must be a finite number > 0, got {self.job_memory_factor}")
        for name in ("busy_retry_after_s", "timing_lock_timeout_s", "log_interval_s", "drain_timeout_s",
                     "worker_start_timeout_s", "job_id_keep_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"ServiceConfig.{name} must be > 0, got {getattr(self, name)}")
        if self.timing_lock not in ("auto", "always", "never"):
            raise ValueError(f"ServiceConfig.timing_lock must be auto, always or never, got {self.timing_lock!r}")
        if self.curve not in CURVE_MODES:
            raise ValueError(f"ServiceConfig.curve must be one of {CURVE_MODES}, got {self.curve!r}")


class BadJob(ValueError):
    """A job the node refuses (answered `Error(bad_message, field=...)`)."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def visible_gpus() -> list[str]:
    """CUDA_VISIBLE_DEVICES entries when set, else the NVML indices; [] without GPUs (torch is not imported)."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        out = [x.strip() for x in env.split(",") if x.strip()]
        return [] if out and out[0].startswith("-") else out
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return [str(i) for i in range(pynvml.nvmlDeviceGetCount())]
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no driver: no GPU
        return []


def job_settings(settings: dict[str, Any], base: SandboxConfig) -> tuple[dict[str, Any], str]:
    """Split `SandboxJob.settings` into SandboxConfig overrides and the cache salt.

    Raises BadJob naming an unknown key, a value of the wrong type or a time limit above the node's.
    """
    overrides: dict[str, Any] = {}
    salt = ""
    for k, v in settings.items():
        if k == CACHE_SALT:
            if not isinstance(v, str) or len(v) > 256:
                raise BadJob(f"SandboxJob.settings.{CACHE_SALT}", "must be a string of at most 256 characters")
            salt = v
            continue
        if k not in EVAL_SETTINGS:
            raise BadJob(f"SandboxJob.settings.{k[:64]}", f"unknown setting (allowed: {', '.join(EVAL_SETTINGS)}, "
                                                         f"{CACHE_SALT})")
        default = getattr(base, k)
        if isinstance(default, bool):
            ok = isinstance(v, bool)
        elif isinstance(default, float):
            ok = isinstance(v, (int, float)) and not isinstance(v, bool)
            v = float(v) if ok else v
        else:
            ok = isinstance(v, type(default)) and not isinstance(v, bool)
        if not ok:
            raise BadJob(f"SandboxJob.settings.{k}", f"expected {type(default).__name__}, got {type(v).__name__}")
        if k in TIME_LIMITS and v > default:
            raise BadJob(f"SandboxJob.settings.{k}", f"{v} s is above this node's limit of {default} s")
        if v != default:
            overrides[k] = v
    return overrides, salt


def content_key(task: Task, files: dict[str, str], fmt: str, cfg: SandboxConfig, salt: str = "") -> str:
    """sha256 hex of what decides a result: the task's reference, id and tolerances, the solution's files, the
    format, the evaluation settings (EVAL_SETTINGS of `cfg`) and the cache salt."""
    doc = {"v": 1, "task": {"id": task.id, "reference": task.reference, "atol": task.atol, "rtol": task.rtol,
                            "shape_params": task.shape_params, "dtype": task.dtype},
           "files": sorted(files), "format": fmt, "settings": {k: getattr(cfg, k) for k in EVAL_SETTINGS}, "salt": salt}
    h = hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode())
    for path in sorted(files):  # file texts hashed piecewise: no copy of the whole solution in one string
        data = files[path].encode()
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()


@dataclasses.dataclass(eq=False)
class _Job:
    """What a queued job carries (QueuedJob.payload)."""

    job: SandboxJob
    task: Task
    overrides: dict[str, Any]
    cfg: SandboxConfig
    footprint_key: str = ""    # the task's key in the node's TaskFootprints
    prebuild: concurrent.futures.Future | None = None
    notes: list[str] = dataclasses.field(default_factory=list)
    exclusive: bool = False    # run alone on its device (evaluated again after running out of memory beside others)


@dataclasses.dataclass(eq=False)
class _Slot:
    index: int
    worker: WorkerProcess
    lock: dict[str, Any] | None
    device: str = "cpu"        # its DeviceLedger's key: the GPU's CUDA_VISIBLE_DEVICES entry, "cpu" on the cpu backend
    ready: bool = False
    thread: threading.Thread | None = None


class SandboxNode:
    """One sandbox node: RPC front end, admission, queue, build pool, worker slots, metrics (see module doc).

    Use: `node = SandboxNode(cfg).start(); node.wait_ready(); ...; node.drain(); node.close()`, or `run_node`.
    Raises ValueError at construction for a configuration it cannot serve (e.g. beyond loopback without CURVE
    keys, cuda backend without a GPU).
    """

    def __init__(self, cfg: ServiceConfig):
        self.cfg = cfg
        self.node_id = cfg.node_id or f"{socket.gethostname()}-{os.getpid()}"
        curve = self._curve()  # refuse an unauthenticated non-loopback bind before starting anything
        sb = cfg.sandbox
        gpus = [g.strip() for g in cfg.gpus.split(",") if g.strip()] if cfg.gpus else visible_gpus()
        backend = sb.backend if sb.backend != "auto" else ("cuda" if gpus else "cpu")
        if backend == "cuda" and not gpus:
            raise ValueError("sandbox node: the cuda backend needs a GPU, and none is visible")
        self.backend = backend
        self.gpus = gpus if backend == "cuda" else []
        self.sandbox_cfg = dataclasses.replace(sb, backend=backend)
        cores = os.cpu_count() or 1
        n = cfg.workers or (len(self.gpus) if backend == "cuda" else max(1, cores // 2))
        self.n_workers = n
        nb = cfg.build_workers if cfg.build_workers >= 0 else max(1, min(8, cores - (0 if backend == "cuda" else n)))
        lock_on = cfg.timing_lock == "always" or (cfg.timing_lock == "auto" and backend == "cuda")
        self.metrics = NodeMetrics(self.gpus)
        self.queue = JobQueue(cfg.queue_max)
        self.store = ResultStore(cfg.result_cache_bytes, cfg.job_ids_kept, cfg.job_id_keep_s, cfg.reuse_results)
        self._mu = threading.Lock()
        self._cv = threading.Condition(self._mu)
        self._by_key: dict[str, QueuedJob] = {}
        self._by_job: dict[str, QueuedJob] = {}
        self._running = 0
        self._service_s = 0.0          # moving average of a job's time on a worker
        self._draining = False
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        sb_dict = dataclasses.asdict(self.sandbox_cfg)
        self.slots: list[_Slot] = []
        self.footprints = TaskFootprints()
        self.ledgers: dict[str, DeviceLedger] = {}
        for i in range(n):
            env: dict[str, str] = {}
            lock = None
            device = "cpu"
            if backend == "cuda":
                gpu = device = self.gpus[i % len(self.gpus)]
                env["CUDA_VISIBLE_DEVICES"] = gpu
                if lock_on:
                    lock = {"key": gpu_device_key(gpu), "dir": cfg.timing_lock_dir, "timeout_s": cfg.timing_lock_timeout_s}
            elif lock_on:
                lock = {"key": cfg.cpu_lock_key, "dir": cfg.timing_lock_dir, "timeout_s": cfg.timing_lock_timeout_s}
            w = WorkerProcess(f"w{i}", sb_dict, env, cfg.evaluators_per_worker, cfg.worker_start_timeout_s)
            self.slots.append(_Slot(i, w, lock, device))
            self.ledgers.setdefault(device, DeviceLedger())
        for device, ledger in self.ledgers.items():
            n_here = sum(s.device == device for s in self.slots)
            if cfg.memory_admission and n_here > 1 and device != "cpu":
                ledger.capacity_bytes = int(gpu_memory_bytes(device) * cfg.gpu_memory_fraction)
                if ledger.capacity_bytes > 0:
                    log.info("sandbox node: GPU %s shared by %d workers; jobs reserve device memory within %.1f GiB",
                             device, n_here, ledger.capacity_bytes / 2**30)
                else:
                    log.warning("sandbox node: GPU %s shared by %d workers, but NVML gave no memory size: jobs are "
                                "not limited by reservations (out-of-memory re-runs still apply)", device, n_here)
        self.prebuilder = None  # built in start() (it probes the isolation: seconds)
        self.n_build = nb
        self.server = RpcServer(cfg.endpoint, self._handle, expect=(SandboxJob,), server_id=self.node_id,
                                role="sandbox", curve=curve, status=self._status,
                                capabilities={"backend": backend, "workers": n, "gpus": len(self.gpus),
                                              "queue_max": cfg.queue_max,
                                              "formats": ["cpu"] if backend == "cpu" else ["cubin", "extension"]})
        self.endpoint = self.server.endpoint
        self.curve_on = curve is not None
        self.metrics_port = -1
        self.metrics.workers.set(0)

    # ------------------------------------------------------------------------------------------ set-up
    def _curve(self) -> CurveServer | None:
        cfg = self.cfg
        return server_curve(cfg.endpoint, cfg.curve, cfg.curve_secret_key, cfg.curve_authorized_keys,
                            who="sandbox node", init_hint="`cuda-agent sandbox serve --init-keys DIR`")

    def start(self) -> "SandboxNode":
        self.server.start()
        if self.n_build > 0:
            t = threading.Thread(target=self._start_prebuilder, name="sandbox-build-start", daemon=True)
            t.start()
            self._threads.append(t)
        for slot in self.slots:
            slot.thread = threading.Thread(target=self._slot_loop, args=(slot,), name=f"sandbox-slot-{slot.index}",
                                           daemon=True)
            slot.thread.start()
        if self.cfg.metrics_port >= 0:
            addr = self.cfg.metrics_addr or ("127.0.0.1" if is_loopback(self.cfg.endpoint) else "0.0.0.0")
            self.metrics_port = self.metrics.serve_http(addr, self.cfg.metrics_port)
        for target, name in ((self._log_loop, "sandbox-log"), (lambda: self.metrics.sample_gpus(self._stop), "sandbox-nvml")):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)
        log.info("sandbox node %s: serving %s (%s backend, %d worker(s), %d build thread(s), queue %d, CURVE %s, "
                 "metrics %s)", self.node_id, self.endpoint, self.backend, self.n_workers, self.n_build,
                 self.cfg.queue_max, "on" if self.curve_on else "off",
                 f"port {self.metrics_port}" if self.metrics_port >= 0 else "off")
        return self

    def _start_prebuilder(self) -> None:
        from sandbox.service_build import Prebuilder

        try:
            self.prebuilder = Prebuilder(self.sandbox_cfg, self.n_build)
        except Exception as e:  # noqa: BLE001 - the workers build for themselves then
            log.warning("sandbox node: no build pool (%s); workers build for themselves", e)

    def wait_ready(self, timeout_s: float | None = None) -> bool:
        """Wait until every worker is up; False on timeout."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not all(s.ready for s in self.slots):
            if deadline is not None and time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    def info(self) -> dict[str, Any]:
        return {"endpoint": self.endpoint, "metrics_port": self.metrics_port, "pid": os.getpid(),
                "node_id": self.node_id, "backend": self.backend, "workers": self.n_workers,
                "worker_pids": [s.worker.pid for s in self.slots], "curve": self.curve_on}

    # ------------------------------------------------------------------------------------------ admission
    def _handle(self, req: RpcRequest) -> Any:
        job: SandboxJob = req.message  # type: ignore[assignment]
        with self._mu:
            if self._draining:
                self.metrics.rejected_job("draining")
                return Error(code="busy", message="node is draining", request_id=job.job_id, retry_after_s=5.0)
            done = self.store.by_job(job.job_id)
            if done is not None:
                self.metrics.cache_hit("job_id")
                return self._result_msg(job.job_id, done, "resent job id answered from memory")
            running = self._by_job.get(job.job_id)
            if running is not None:
                running.waiters.append((req, job.job_id))
                self.metrics.cache_hit("coalesced")
                return None
            if self.queue.full():  # refuse before hashing the files: overload must stay cheap
                return self._busy(job, "queue full")
        try:
            prepared = self._prepare(job)
        except BadJob as e:
            self.metrics.rejected_job("bad_message")
            log.warning("sandbox node: job %s refused: %s", job.job_id, e)
            return Error(code="bad_message", field=e.field[:512], message=e.message[:4096], request_id=job.job_id)
        key = prepared[1]
        with self._mu:
            if self._draining:
                self.metrics.rejected_job("draining")
                return Error(code="busy", message="node is draining", request_id=job.job_id, retry_after_s=5.0)
            done = self.store.by_content(key)
            if done is not None:
                self.metrics.cache_hit("content")
                self.store.put(job.job_id, key, done, reusable=True)
                return self._result_msg(job.job_id, done, f"same content as a job evaluated before (key {key[:12]})")
            same = self._by_key.get(key)
            if same is not None:
                same.waiters.append((req, job.job_id))
                self._by_job[job.job_id] = same
                self.metrics.cache_hit("coalesced")
                return None
            ready = max(1, sum(s.ready for s in self.slots))
            est_wait_s = (self.queue.ahead_of(job.priority) + self._running) / ready * self._service_s
            if self.queue.full():
                return self._busy(job, "queue full")
            if self._service_s > 0 and est_wait_s > job.deadline_s:
                return self._busy(job, f"estimated wait {est_wait_s:.0f} s > deadline {job.deadline_s:.0f} s")
            payload = prepared[0]
            entry = QueuedJob(key=key, priority=job.priority, deadline=time.monotonic() + job.deadline_s,
                              payload=payload, waiters=[(req, job.job_id)])
            self.queue.push(entry)
            self._by_key[key] = entry
            self._by_job[job.job_id] = entry
            if self.prebuilder is not None:
                payload.prebuild = self.prebuilder.submit(payload.task, job.files, job.format, payload.cfg)
            self.metrics.set_queue(self.queue.depth_by_priority())
            self._cv.notify_all()
        return None

    def _busy(self, job: SandboxJob, why: str) -> Error:
        """The backpressure answer (hold the lock)."""
        self.metrics.rejected_job("busy")
        ready = max(1, sum(s.ready for s in self.slots))
        retry = max(self.cfg.busy_retry_after_s, min(5.0, self._service_s / ready))
        return Error(code="busy", message=f"{why} ({len(self.queue)}/{self.cfg.queue_max} queued)",
                     request_id=job.job_id, retry_after_s=retry)

    def _prepare(self, job: SandboxJob) -> tuple[_Job, str]:
        try:
            task = Task.from_dict(job.task)
        except Exception as e:  # noqa: BLE001 - any malformed record is the client's fault
            raise BadJob("SandboxJob.task", f"not a valid task record: {e}") from None
        try:
            check_format(job.format, self.backend)
        except ValueError as e:
            raise BadJob("SandboxJob.format", f"{e} (this node runs the {self.backend} backend)") from None
        overrides, salt = job_settings(job.settings, self.sandbox_cfg)
        try:
            cfg = dataclasses.replace(self.sandbox_cfg, **overrides)
        except ValueError as e:
            raise BadJob("SandboxJob.settings", str(e)) from None
        return (_Job(job, task, overrides, cfg, footprint_key=task_footprint_key(job.task)),
                content_key(task, job.files, job.format, cfg, salt))

    def _result_msg(self, job_id: str, result: dict[str, Any], note: str | None = None) -> SandboxResult:
        if note:
            result = dict(result, log=[*result.get("log", []), f"{note} (node {self.node_id})"])
        return SandboxResult(job_id=job_id, status=str(result.get("status", "internal_error")), result=result,
                             node_id=self.node_id)

    def _status(self) -> dict[str, Any]:
        with self._mu:
            queued, running, draining = len(self.queue), self._running, self._draining
        ready = sum(s.ready for s in self.slots)
        free = -(self.cfg.queue_max + 1) if draining else ready - running - queued
        return {"free": free, "queued": queued, "running": running, "workers": self.n_workers,
                "workers_ready": ready, "queue_max": self.cfg.queue_max, "draining": draining,
                "backend": self.backend, "worker_pids": [s.worker.pid or 0 for s in self.slots],
                "worker_has_job": [s.worker.has_job for s in self.slots], **self.metrics.snapshot()}

    # ------------------------------------------------------------------------------------------ workers
    def _slot_loop(self, slot: _Slot) -> None:
        backoff = 1.0
        while not self._stop.is_set():
            if not slot.worker.alive():
                slot.ready = False
                self.metrics.workers.set(sum(s.ready for s in self.slots))
                try:
                    info = slot.worker.start()
                except WorkerLost as e:
                    log.error("sandbox node: %s", e)
                    self._stop.wait(backoff)
                    backoff = min(backoff * 2, 60.0)
                    continue
                backoff = 1.0
                slot.ready = True
                self.metrics.workers.set(sum(s.ready for s in self.slots))
                log.info("sandbox node: worker %s up (pid %s, %s, isolation %s)", slot.worker.name, info.get("pid"),
                         info.get("device"), info.get("isolation"))
            entry = self._take(slot)
            if entry is None:
                continue
            self.metrics.worker_busy(slot.index, True)
            try:
                self._run(slot, entry)
            except Exception:  # noqa: BLE001 - a node bug: answer the job, keep the slot
                log.exception("sandbox node: slot %d failed on job %s", slot.index, entry.key[:12])
                self._finish(entry, EvalResult.failure(Status.INTERNAL_ERROR, "sandbox node error while running "
                                                       "the job").to_dict())
            finally:
                self.metrics.worker_busy(slot.index, False)
                with self._mu:
                    self._running -= 1
                    self.ledgers[slot.device].finish(slot.index)
                    self._cv.notify_all()

    def _need_bytes(self, p: _Job) -> int:
        """Device memory a job reserves: job_memory_factor x its task's measured peak (0 while unmeasured; hold
        the lock)."""
        if not self.cfg.memory_admission:
            return 0
        return int(self.cfg.job_memory_factor * self.footprints.get(p.footprint_key))

    def _take(self, slot: _Slot) -> QueuedJob | None:
        """The next job for `slot`, once its device has room for it; None when stopping, after answering a job
        whose deadline passed or that a drain hands back, or after putting a held job back for another GPU.

        A job that fits on no GPU with a free slot is held here (the device's other slots take none meanwhile, so a
        large job is not starved by small ones) until it fits, or goes back to the queue when another GPU can take
        it, and is answered when its deadline passes or the node drains."""
        gone: list[QueuedJob] = []
        handed_back: list[QueuedJob] = []
        ledger = self.ledgers[slot.device]
        with self._cv:
            entry = None
            while entry is None and not self._stop.is_set():
                if ledger.blocked_for(slot.index):
                    self._cv.wait(0.5)
                    continue
                head = self.queue.peek()
                if head is None:
                    self._cv.wait(0.5)
                    continue
                if head.deadline < time.monotonic():
                    self.queue.pop()
                    gone.append(head)
                    self._forget(head)
                    break  # answered at once; the slot loop asks again
                need, alone = self._need_bytes(head.payload), head.payload.exclusive
                if not ledger.fits(need, alone) and self._elsewhere(slot.device, need, alone):
                    self._cv.wait(0.5)  # a free slot of another GPU takes it
                    continue
                entry = self.queue.pop()
                self._running += 1
                while not ledger.fits(need, alone) and not self._stop.is_set() and not self._draining \
                        and entry.deadline >= time.monotonic() and not self._elsewhere(slot.device, need, alone):
                    ledger.holder = slot.index
                    self._cv.wait(0.5)
                if ledger.holder == slot.index:
                    ledger.holder = None
                if ledger.fits(need, alone) and not self._stop.is_set() and not self._draining:
                    ledger.start(slot.index, need, alone)
                    break
                self._running -= 1
                if self._draining:
                    handed_back.append(entry)
                    self._forget(entry)
                elif entry.deadline < time.monotonic():
                    gone.append(entry)
                    self._forget(entry)
                else:  # stopping, or another GPU can take it
                    self.queue.push(entry, force=True)
                entry = None
                self._cv.notify_all()
                break  # answer what was dropped; the slot loop asks again
            self.metrics.set_queue(self.queue.depth_by_priority())
        for e in gone:
            self.metrics.rejected_job("expired")
            self._answer_error(e, Error(code="gone", message="the job's deadline passed while it was queued; "
                                        "not run", request_id=e.payload.job.job_id))
        for e in handed_back:
            self._hand_back(e)
        return entry

    def _elsewhere(self, device: str, need: int, alone: bool) -> bool:
        """Whether a ready slot of another device is free (running and holding nothing) and the job fits there now
        (hold the lock)."""
        for d, led in self.ledgers.items():
            if d != device and led.holder is None and led.fits(need, alone) and any(
                    s.device == d and s.ready and s.index not in led.reserved for s in self.slots):
                return True
        return False

    def _run(self, slot: _Slot, entry: QueuedJob) -> None:
        p: _Job = entry.payload
        job = p.job
        t_take = time.monotonic()
        stage: dict[str, float] = {"queue": (t_take - entry.accepted) * 1e3}
        if p.prebuild is not None:
            try:
                outcome = p.prebuild.result(timeout=p.cfg.build_timeout_s + 60)
                if outcome.status != "skipped":
                    stage["prebuild"] = outcome.elapsed_ms
            except Exception as e:  # noqa: BLE001 - the worker builds itself
                log.warning("sandbox node: prebuild of job %s: %s", job.job_id, e)
            p.prebuild = None
        msg = {"op": "evaluate", "job_id": job.job_id, "task": job.task, "files": job.files, "format": job.format,
               "settings": p.overrides, "lock": slot.lock}
        t0 = time.monotonic()
        try:
            out = slot.worker.run(msg, self._job_bound(p.cfg))
        except WorkerLost as e:
            slot.ready = False
            self.metrics.worker_restart()
            # a worker found dead before the job reached it is not the job's doing: not counted as its loss, but
            # bounded on its own (a node whose workers keep dying answers the job instead of cycling it)
            if e.reached:
                entry.failures += 1
            else:
                entry.unreached += 1
            unreached_max = 2 * self.cfg.max_worker_failures + 1
            log.warning("sandbox node: %s (job %s, loss %d of %d allowed%s); replacing the worker", e, job.job_id,
                        entry.failures, self.cfg.max_worker_failures,
                        "" if e.reached else f", not counted: {entry.unreached} of {unreached_max} such")
            p.notes.append(f"{e}; worker replaced")
            if entry.failures >= self.cfg.max_worker_failures or entry.unreached >= unreached_max:
                why = (f"the job lost {entry.failures} workers ({e}); not retried (poisoned job?)" if e.reached else
                       f"{entry.unreached} workers were found dead when the job reached them ({e}); not retried "
                       "(the node's workers keep dying)")
                res = EvalResult.failure(Status.INTERNAL_ERROR, why, task_id=p.task.id, format=job.format,
                                         backend=self.backend).to_dict()
                self._finish(entry, res, stage)
            else:
                with self._cv:
                    self.queue.push(entry, force=True)  # keeps its place: same priority, deadline and sequence
                    self._cv.notify_all()
            return
        dt = time.monotonic() - t0
        self._service_s = dt if self._service_s == 0 else 0.8 * self._service_s + 0.2 * dt
        if out.get("op") == "error":
            if out.get("kind") == "usage":
                self.metrics.rejected_job("bad_message")
                self._answer_error(entry, Error(code="bad_message", field="SandboxJob", request_id=job.job_id,
                                                message=str(out.get("message", ""))[:4096]))
                return
            log.error("sandbox node: worker error on job %s: %s", job.job_id, out.get("message"))
            res = EvalResult.failure(Status.INTERNAL_ERROR, "sandbox worker error: " +
                                     str(out.get("message", "")).splitlines()[0][:500], task_id=p.task.id,
                                     format=job.format, backend=self.backend).to_dict()
        else:
            res = out["result"]
        peak = int(res.get("device_peak_bytes", 0) or 0)
        with self._mu:
            grew = self.footprints.record(p.footprint_key, peak)
            need = self._need_bytes(p)
            shared = slot.index in self.ledgers[slot.device].shared
        if grew and self.cfg.memory_admission:
            log.info("sandbox node: task %s: trusted device peak %.2f GiB; its jobs reserve %.2f GiB", p.task.id,
                     peak / 2**30, need / 2**30)
        # one budget for both kinds of re-run: at most 1 + max(1, internal_error_retries) evaluations of a job
        if (self.cfg.memory_admission and shared and slot.device != "cpu" and not p.exclusive
                and entry.retries < max(1, self.cfg.internal_error_retries)
                and out_of_memory(res, self.cfg.oom_free_fraction)):
            p.exclusive = True
            entry.retries += 1
            self.metrics.rejected_job("oom_rerun")
            why = str(res.get("message", ""))[:300]
            log.warning("sandbox node: job %s ran out of device memory beside other jobs (%s); evaluating it again "
                        "alone", job.job_id, why)
            p.notes.append(f"{res.get('status')} on a device shared with other jobs, out of memory ({why}; "
                           f"{res.get('device_free_fraction', -1):.0%} of the device free); evaluated again alone")
            with self._cv:
                self.queue.push(entry, force=True)
                self._cv.notify_all()
            return
        if res.get("status") == Status.INTERNAL_ERROR.value and entry.retries < self.cfg.internal_error_retries:
            entry.retries += 1
            self.metrics.rejected_job("internal_retry")
            log.warning("sandbox node: job %s: internal_error (%s); evaluating it again", job.job_id,
                        str(res.get("message", ""))[:300])
            p.notes.append(f"internal_error on the first try ({str(res.get('message', ''))[:300]}); evaluated again")
            with self._cv:
                self.queue.push(entry, force=True)
                self._cv.notify_all()
            return
        self._finish(entry, res, stage)

    def _job_bound(self, c: SandboxConfig) -> float:
        """Backstop on one job's time in a worker (the Evaluator's own limits end it far sooner)."""
        build = max(c.build_timeout_s, c.extension_build_timeout_s)
        one = c.reference_timeout_s + max(c.load_timeout_s, c.extension_build_timeout_s) + \
            c.num_trials * c.trial_timeout_s * 1.5 + c.profile_timeout_s + 60.0
        return build + 2 * one + self.cfg.timing_lock_timeout_s + self.cfg.worker_start_timeout_s

    # ------------------------------------------------------------------------------------------ answers
    def _forget(self, entry: QueuedJob) -> None:
        """Drop the node's references to `entry` (hold the lock)."""
        if self._by_key.get(entry.key) is entry:
            del self._by_key[entry.key]
        for _, jid in entry.waiters:
            if self._by_job.get(jid) is entry:
                del self._by_job[jid]

    def _finish(self, entry: QueuedJob, result: dict[str, Any], stage: dict[str, float] | None = None) -> None:
        p: _Job = entry.payload
        result = dict(result)
        stage_ms = dict(result.get("stage_ms", {}))
        stage_ms.update(stage or {})
        stage_ms["node"] = (time.monotonic() - entry.accepted) * 1e3
        result["stage_ms"] = stage_ms
        if p.notes:
            result["log"] = [*result.get("log", []), *p.notes]
        status = str(result.get("status", "internal_error"))
        reusable = status != Status.INTERNAL_ERROR.value and not result.get("contended", False)
        with self._mu:
            self._forget(entry)
            waiters = list(entry.waiters)
            for _, jid in waiters:
                self.store.put(jid, entry.key, result, reusable=reusable)
        self.metrics.job_done(status, stage_ms)
        if result.get("contended"):
            self.metrics.contended_result()
        for req, jid in waiters:
            req.reply(self._result_msg(jid, result))

    def _hand_back(self, entry: QueuedJob) -> None:
        """Answer a job the draining node will not run with Error(busy): its client resends it elsewhere."""
        self.metrics.rejected_job("draining")
        self._answer_error(entry, Error(code="busy", message="node is draining", retry_after_s=5.0,
                                        request_id=entry.payload.job.job_id))

    def _answer_error(self, entry: QueuedJob, err: Error) -> None:
        with self._mu:
            self._forget(entry)
            waiters = list(entry.waiters)
        for req, jid in waiters:
            req.reply(dataclasses.replace(err, request_id=jid))

    # ------------------------------------------------------------------------------------------ life cycle
    def _log_loop(self) -> None:
        while not self._stop.wait(self.cfg.log_interval_s):
            with self._mu:
                depth, running = len(self.queue), self._running
            log.info("%s", self.metrics.log_line(depth, running, self.n_workers))

    def drain(self, timeout_s: float | None = None) -> bool:
        """Refuse new jobs, hand queued ones back (Error(busy): clients resend them elsewhere), wait for the
        running ones. True when every running job finished within `timeout_s`."""
        timeout_s = self.cfg.drain_timeout_s if timeout_s is None else timeout_s
        with self._mu:
            self._draining = True
            queued = self.queue.drain()
            self.metrics.set_queue({})
        log.info("sandbox node %s: draining (%d queued job(s) handed back, %d running)", self.node_id, len(queued),
                 self._running)
        for e in queued:
            self._hand_back(e)
        deadline = time.monotonic() + timeout_s
        with self._cv:
            while self._running > 0 and time.monotonic() < deadline:
                self._cv.wait(0.2)
            ok = self._running == 0
        time.sleep(0.3)  # let the RPC loop send the last replies
        return ok

    def close(self) -> None:
        self._stop.set()
        with self._cv:
            self._cv.notify_all()
        for s in self.slots:
            if s.thread is not None:
                s.thread.join(timeout=5)
            s.worker.stop()
        if self.prebuilder is not None:
            self.prebuilder.close()
        self.server.close()
        self.metrics.close()


# ---------------------------------------------------------------------------------------------- entry points
def _return_freed_memory() -> None:
    """Fix glibc's mmap threshold at 256 KiB: a job's megabyte-sized files are then mmapped and given back to the
    OS when freed, instead of raising the dynamic threshold and staying in the heap (RSS creep under overload)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").mallopt(-3, 256 * 1024)  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        pass


def run_node(cfg: ServiceConfig) -> int:
    """Serve until SIGTERM / SIGINT, then drain and exit (0 when drained cleanly). Blocking."""
    _return_freed_memory()
    stop = threading.Event()
    signals = {"n": 0}

    def on_signal(signum: int, _frame: Any) -> None:
        signals["n"] += 1
        if signals["n"] > 1:
            log.warning("sandbox node: second signal, exiting now")
            os._exit(1)
        stop.set()

    node = SandboxNode(cfg).start()
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        while not node.wait_ready(0.2):
            if stop.is_set():
                break
        if cfg.ready_file and not stop.is_set():
            tmp = Path(cfg.ready_file + ".tmp")
            tmp.write_text(json.dumps(node.info()))
            os.replace(tmp, cfg.ready_file)
            log.info("sandbox node %s: ready (%s)", node.node_id, json.dumps(node.info()))
        while not stop.wait(0.5):
            pass
        clean = node.drain()
    finally:
        node.close()
    log.info("sandbox node %s: stopped%s", node.node_id, "" if clean else " (drain timed out)")
    return 0 if clean else 3


def main(argv: list[str] | None = None) -> int:
    """`python -m sandbox.service [config.yaml] [key=value ...]` (the same as `cuda-agent sandbox serve`)."""
    from cuda_agent.config import config_path_and_overrides, load_config

    path, args = config_path_and_overrides(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cfg = load_config(ServiceConfig, path, args)
    return run_node(cfg)


if __name__ == "__main__":
    sys.exit(main())
