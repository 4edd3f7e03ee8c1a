"""Metrics of the sandbox node: a Prometheus registry (scraped at the node's HTTP endpoint), a periodic log line
with the same figures, and cumulative counters that clients read from heartbeats.

Prometheus names (all prefixed `cuda_agent_sandbox_`):
  queue_depth{priority}             jobs waiting, by priority (gauge)
  workers, workers_busy             verify/profile workers up / running a job (gauges)
  jobs_total{status}                finished jobs by EvalResult status (counter)
  rejected_total{reason}            jobs refused: busy, draining, bad_message, expired; and internal_retry:
                                    internal_error results evaluated again, oom_rerun: jobs that ran out of
                                    device memory beside others, evaluated again alone (counter)
  cache_hits_total{kind}            answered from memory: job_id, content, coalesced (counter)
  worker_restarts_total             worker processes replaced after dying or hanging (counter)
  contended_total                   results timed without the device's timing lock (counter)
  stage_seconds{stage}              per-stage latency histogram: queue, prebuild, workspace, static_check, build,
                                    reference, candidate_start, load, verify, profile, timing_lock_wait (the timed
                                    sections' waits for the lock), timing_lock_shared_wait (the untimed GPU work's),
                                    total (EvalResult.stage_ms), node (accept -> reply)
  gpu_busy_ratio{gpu}               NVML utilisation of each served GPU, last sample (gauge)
Log keys (one line every `log_interval_s`): sandbox/queue_depth, sandbox/busy_workers, sandbox/jobs_<status>,
sandbox/rejected_<reason>, sandbox/worker_restarts, sandbox/<stage>_p50_ms and _p95_ms over the last 1,000 jobs.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Any, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

log = logging.getLogger("sandbox.service")

PREFIX = "cuda_agent_sandbox"
STAGES = ("queue", "prebuild", "workspace", "static_check", "build", "reference", "candidate_start", "calibration",
          "load", "verify", "profile", "profile_timed", "timing_lock_wait", "timing_lock_shared_wait",
          "timing_lock_held", "previous_teardown", "total", "node")
_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64, 128, 256, 600, float("inf"))


class NodeMetrics:
    """All counters of one node (thread-safe)."""

    def __init__(self, gpus: Sequence[str] = ()):
        self.registry = CollectorRegistry()
        r = self.registry
        self.queue_depth = Gauge(f"{PREFIX}_queue_depth", "Jobs waiting in the node's queue", ["priority"], registry=r)
        self.workers = Gauge(f"{PREFIX}_workers", "Verify/profile workers up", registry=r)
        self.workers_busy = Gauge(f"{PREFIX}_workers_busy", "Workers running a job", registry=r)
        self.jobs = Counter(f"{PREFIX}_jobs", "Finished jobs by status", ["status"], registry=r)
        self.rejected = Counter(f"{PREFIX}_rejected", "Jobs refused", ["reason"], registry=r)
        self.cache_hits = Counter(f"{PREFIX}_cache_hits", "Jobs answered from memory", ["kind"], registry=r)
        self.restarts = Counter(f"{PREFIX}_worker_restarts", "Worker processes replaced", registry=r)
        self.contended = Counter(f"{PREFIX}_contended", "Results timed without the timing lock", registry=r)
        self.stage = Histogram(f"{PREFIX}_stage_seconds", "Per-stage latency", ["stage"], buckets=_BUCKETS,
                               registry=r)
        self.gpu_busy = Gauge(f"{PREFIX}_gpu_busy_ratio", "GPU utilisation (NVML), last sample", ["gpu"], registry=r)
        self._lock = threading.Lock()
        self.counts: collections.Counter[str] = collections.Counter()
        self._recent: dict[str, collections.deque] = {s: collections.deque(maxlen=1000) for s in STAGES}
        self.gpus = list(gpus)
        # cumulative integrals read by clients (differences over a window give fractions)
        self.gpu_util_integral = 0.0     # sum of (utilisation 0..1) x seconds, averaged over GPUs
        self.gpu_time_s = 0.0            # seconds covered by GPU samples
        self.worker_busy_s = 0.0         # sum over workers of seconds spent on jobs
        self.stage_s: collections.Counter[str] = collections.Counter()  # per stage: seconds summed over jobs
        self._busy_since: dict[int, float] = {}
        self._priorities: set[int] = set()
        self._http = None

    # ---------------------------------------------------------------------------------------- events
    def job_done(self, status: str, stage_ms: dict[str, float]) -> None:
        self.jobs.labels(status).inc()
        with self._lock:
            self.counts[f"jobs_{status}"] += 1
            for s, ms in stage_ms.items():
                if s in self._recent and isinstance(ms, (int, float)):
                    self._recent[s].append(float(ms))
                    self.stage_s[s] += float(ms) / 1e3
        for s, ms in stage_ms.items():
            if s in STAGES and isinstance(ms, (int, float)):
                self.stage.labels(s).observe(float(ms) / 1e3)

    def rejected_job(self, reason: str) -> None:
        self.rejected.labels(reason).inc()
        with self._lock:
            self.counts[f"rejected_{reason}"] += 1

    def cache_hit(self, kind: str) -> None:
        self.cache_hits.labels(kind).inc()
        with self._lock:
            self.counts[f"cache_{kind}"] += 1

    def worker_restart(self) -> None:
        self.restarts.inc()
        with self._lock:
            self.counts["worker_restarts"] += 1

    def contended_result(self) -> None:
        self.contended.inc()
        with self._lock:
            self.counts["contended"] += 1

    def worker_busy(self, slot: int, busy: bool) -> None:
        now = time.monotonic()
        with self._lock:
            if busy:
                self._busy_since[slot] = now
            else:
                start = self._busy_since.pop(slot, None)
                if start is not None:
                    self.worker_busy_s += now - start
            self.workers_busy.set(len(self._busy_since))

    def busy_seconds(self) -> float:
        """Cumulative worker busy time, including the jobs running now."""
        now = time.monotonic()
        with self._lock:
            return self.worker_busy_s + sum(now - t for t in self._busy_since.values())

    def set_queue(self, by_priority: dict[int, int]) -> None:
        with self._lock:
            seen = set(self._priorities) | set(by_priority)
            self._priorities = seen
        for p in seen:
            self.queue_depth.labels(str(p)).set(by_priority.get(p, 0))

    # ---------------------------------------------------------------------------------------- reports
    def percentiles(self) -> dict[str, float]:
        out = {}
        with self._lock:
            for s, values in self._recent.items():
                if values:
                    v = sorted(values)
                    out[f"{s}_p50_ms"] = v[len(v) // 2]
                    out[f"{s}_p95_ms"] = v[min(len(v) - 1, int(len(v) * 0.95))]
        return out

    def log_line(self, queue_depth: int, busy: int, workers: int) -> str:
        with self._lock:
            counts = dict(self.counts)
        parts = [f"sandbox/queue_depth={queue_depth}", f"sandbox/busy_workers={busy}/{workers}"]
        parts += [f"sandbox/{k}={v}" for k, v in sorted(counts.items())]
        parts += [f"sandbox/{k}={v:.0f}" for k, v in sorted(self.percentiles().items())
                  if k.split("_p")[0] in ("queue", "build", "verify", "profile", "total", "node")]
        if self.gpu_time_s > 0:
            parts.append(f"sandbox/gpu_busy={self.gpu_util_integral / self.gpu_time_s:.2f}")
        return " ".join(parts)

    def serve_http(self, addr: str, port: int) -> int:
        """Start the Prometheus endpoint; returns the port it listens on."""
        server, _ = start_http_server(port, addr=addr, registry=self.registry)
        self._http = server
        return server.server_address[1]

    def close(self) -> None:
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None

    # ---------------------------------------------------------------------------------------- GPU sampling
    def sample_gpus(self, stop: threading.Event, period_s: float = 0.5) -> None:
        """Sample NVML utilisation of `self.gpus` (CUDA_VISIBLE_DEVICES entries) until `stop` (run in a thread)."""
        if not self.gpus:
            return
        try:
            import pynvml

            pynvml.nvmlInit()
        except Exception as e:  # noqa: BLE001 - no NVML: no GPU busy figures
            log.info("sandbox node: NVML unavailable (%s); no GPU busy figures", e)
            return
        try:
            handles = []
            for g in self.gpus:
                h = (pynvml.nvmlDeviceGetHandleByUUID(g) if not g.isdigit() else pynvml.nvmlDeviceGetHandleByIndex(int(g)))
                handles.append((g, h))
            last = time.monotonic()
            while not stop.wait(period_s):
                now = time.monotonic()
                utils = []
                for g, h in handles:
                    try:
                        u = pynvml.nvmlDeviceGetUtilizationRates(h).gpu / 100.0
                    except Exception:  # noqa: BLE001
                        continue
                    utils.append(u)
                    self.gpu_busy.labels(g).set(u)
                if utils:
                    with self._lock:
                        self.gpu_util_integral += (now - last) * sum(utils) / len(utils)
                        self.gpu_time_s += now - last
                last = now
        except Exception as e:  # noqa: BLE001
            log.warning("sandbox node: GPU sampling stopped: %s", e)
        finally:
            try:
                pynvml.nvmlShutdown()
            except Exception:  # noqa: BLE001
                pass

    def snapshot(self) -> dict[str, Any]:
        """Cumulative figures for heartbeats (clients difference two snapshots)."""
        with self._lock:
            counts = dict(self.counts)
            gpu = (self.gpu_util_integral, self.gpu_time_s)
            stage_s = dict(self.stage_s)
        return {"counts": counts, "worker_busy_s": self.busy_seconds(), "gpu_util_s": gpu[0], "gpu_time_s": gpu[1],
                "stage_s": stage_s}
