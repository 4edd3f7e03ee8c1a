"""The typed result of one sandbox evaluation (`EvalResult`), and its plain-map form for the wire.

`EvalResult.to_dict()` gives a map of str / int / float / bool / None / list / dict only (msgpack- and
JSON-able); the protocol carries it as `SandboxResult.result`. `EvalResult.from_dict` inverts it exactly and
raises ValueError naming a missing or unknown field.

Status taxonomy (each result carries a message a person can act on):
  ok              built, correct on every check, profiled; reward >= 0
  compile_error   the build failed (diagnostics in `compile_log`)
  load_error      model_new.py failed to import or ModelNew failed to construct / take the reference weights
  runtime_error   forward raised, crashed the worker (segfault, illegal address) or returned the wrong structure
  timeout         a stage ran past its wall-clock limit (the whole process tree was killed)
  incorrect       outputs differ from the reference (values, NaN/Inf, shapes, dtypes, aliasing, unwritten memory)
  forbidden       a rule was broken (torch compute in forward, forbidden import or symbol, ...): see `violations`
  internal_error  the sandbox itself failed; not the candidate's fault (the reward is then meaningless)
"""

from __future__ import annotations

import dataclasses
import enum
import re
from typing import Any

#: A device out-of-memory error's text (torch's, the driver's, the runtime's): the trusted worker reads the device's
#: free memory after such a failure (EvalResult.device_free_fraction), and the node's admission re-runs it alone
#: (sandbox.service_admission.out_of_memory).
OOM_PATTERN = re.compile(r"out of memory|CUDA_ERROR_OUT_OF_MEMORY|cudaErrorMemoryAllocation", re.IGNORECASE)


class Status(str, enum.Enum):
    OK = "ok"
    COMPILE_ERROR = "compile_error"
    LOAD_ERROR = "load_error"
    RUNTIME_ERROR = "runtime_error"
    TIMEOUT = "timeout"
    INCORRECT = "incorrect"
    FORBIDDEN = "forbidden"
    INTERNAL_ERROR = "internal_error"


FAILED_REWARD = -1.0


def _check_keys(cls: type, d: dict[str, Any]) -> None:
    if not isinstance(d, dict):
        raise ValueError(f"{cls.__name__}: expected a map, got {type(d).__name__}")
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(d) - names
    if unknown:
        raise ValueError(f"{cls.__name__}: unknown field(s) {sorted(unknown)}")
    required = {f.name for f in dataclasses.fields(cls)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}  # type: ignore[misc]
    missing = required - set(d)
    if missing:
        raise ValueError(f"{cls.__name__}: missing field(s) {sorted(missing)}")


@dataclasses.dataclass
class Violation:
    """A broken rule. kind: stable id (e.g. "dispatch_op", "import", "symbol", "static", "alias");
    detail: what was caught and where (e.g. "aten::matmul called inside ModelNew.forward")."""

    kind: str
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Violation":
        _check_keys(cls, d)
        return cls(**d)


@dataclasses.dataclass
class TrialResult:
    """One verification trial on a fresh-seed input set.

    Fields:
      index: trial number (0-based); the seeds themselves are never reported.
      ok: outputs matched the reference within tolerance.
      max_abs_err, max_rel_err: largest |cand - ref| and |cand - ref| / (|ref| + 1e-12) over all output elements
        (NaN when the structure did not match).
      mismatched: number of elements outside atol + rtol * |ref| (non-finite mismatches included).
      numel: total number of output elements compared.
      message: why the trial failed ("" when ok).
    """

    index: int
    ok: bool
    max_abs_err: float = float("nan")
    max_rel_err: float = float("nan")
    mismatched: int = 0
    numel: int = 0
    message: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TrialResult":
        _check_keys(cls, d)
        return cls(**d)


@dataclasses.dataclass
class Distribution:
    """Per-call run time of one implementation over the interleaved repetitions (ms per call).

    Fields: median_ms, iqr_ms (75th - 25th percentile), min_ms, mean_ms, reps (number of repetitions),
    samples_ms (every repetition's per-call time, in repetition order)."""

    median_ms: float
    iqr_ms: float
    min_ms: float
    mean_ms: float
    reps: int
    samples_ms: list[float] = dataclasses.field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Distribution":
        _check_keys(cls, d)
        return cls(**d)


@dataclasses.dataclass
class SpeedUp:
    """Ratio baseline median / candidate median, with a bootstrap confidence interval [lo, hi] at `level`."""

    point: float
    lo: float
    hi: float
    level: float

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "SpeedUp":
        _check_keys(cls, d)
        return cls(**d)


@dataclasses.dataclass
class TimingStats:
    """What the profile stage measured.

    Fields:
      device: "cpu" or the CUDA device name.
      calls_per_rep: forward calls timed together in one repetition (time per call = batch time / calls).
      warmup_calls: untimed calls of each implementation before the first repetition, in one request (at least
        SandboxConfig.warmup_calls and at least calls_per_rep; 0 = none).
      eager, compiled, candidate: per-call time distributions (see Distribution).
      speedup_eager, speedup_compile: candidate speed-up over eager / torch.compile with intervals.
      candidate_wall_ms: the trusted side's wall clock around each candidate repetition (includes IPC), ms per call.
      baseline_policy: "interleaved" (baselines re-timed with every evaluation, see sandbox.profile).
      milestone: reward level reached (0-3) and `milestone_reason`, a sentence saying why.
    """

    device: str
    calls_per_rep: int
    warmup_calls: int
    eager: Distribution
    compiled: Distribution | None
    candidate: Distribution
    speedup_eager: SpeedUp
    speedup_compile: SpeedUp | None
    candidate_wall_ms: list[float] = dataclasses.field(default_factory=list)
    baseline_policy: str = "interleaved"
    milestone: int = 0
    milestone_reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TimingStats":
        _check_keys(cls, d)
        d = dict(d)
        d["eager"] = Distribution.from_dict(d["eager"])
        d["candidate"] = Distribution.from_dict(d["candidate"])
        d["compiled"] = Distribution.from_dict(d["compiled"]) if d.get("compiled") is not None else None
        d["speedup_eager"] = SpeedUp.from_dict(d["speedup_eager"])
        d["speedup_compile"] = (SpeedUp.from_dict(d["speedup_compile"])
                                if d.get("speedup_compile") is not None else None)
        return cls(**d)


@dataclasses.dataclass
class EvalResult:
    """The outcome of evaluating one solution on one task.

    Fields:
      status: one of Status (see module doc). reward: -1 on failure, else the milestone 0-3 (DESIGN.md).
      message: one line a person can act on.
      task_id, format ("cubin" | "extension" | "cpu"), backend ("cuda" | "cpu").
      stage_ms: wall-clock time per stage in ms: workspace, static_check, build, load, verify, profile, total
        (and, when present, the finer ones the worker reports: reference, candidate_start, calibration,
        profile_timed, timing_lock_wait, previous_teardown: the wait for the previous candidate's tree to exit).
      compile_log: the build's diagnostics, truncated, with workspace-relative paths. build_cached: build reused.
      trials: one TrialResult per verification input set (then one more for the outputs of the timed calls).
      timing: what the profile stage measured (None when it did not run).
      violations: rules broken (non-empty for `forbidden`).
      isolation: what isolated the candidate: mode ("namespaces" | "none"), namespaces, readonly_root, uid,
        rlimits, network.
      nvml: GPU readings (clocks MHz, temperature C, utilisation %, power W) at the start and end of profiling.
      log: further notes (state_dict keys that did not match, worker replaced, ...).
      contended: the device's timing lock (sandbox.service_lock) could not be had for this evaluation, so other
        work may have shared the device while it was timed: re-measure before trusting the reward.
      device_peak_bytes: the trusted worker's peak of device memory reserved by torch over this evaluation, above
        what it held before (reference, inputs, expected outputs, comparisons), bytes; 0 on the CPU backend or when
        it did not run. The sandbox node sizes its jobs' device-memory reservations from it
        (sandbox.service_admission).
      device_free_fraction: after a device out-of-memory failure outside the profile (a stage's, or trusted code's),
        the free share (0..1) of the device's memory, all processes, read by the trusted worker once the failed
        candidate's processes have exited; after a failed reference, read at once; -1.0 when not read (any other
        result, the CPU backend). The node's out-of-memory re-run requires it to be low (trusted evidence).
    """

    status: str
    reward: float
    message: str = ""
    task_id: str = ""
    format: str = ""
    backend: str = ""
    stage_ms: dict[str, float] = dataclasses.field(default_factory=dict)
    compile_log: str = ""
    build_cached: bool = False
    trials: list[TrialResult] = dataclasses.field(default_factory=list)
    timing: TimingStats | None = None
    violations: list[Violation] = dataclasses.field(default_factory=list)
    isolation: dict[str, Any] = dataclasses.field(default_factory=dict)
    nvml: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    log: list[str] = dataclasses.field(default_factory=list)
    contended: bool = False
    device_peak_bytes: int = 0
    device_free_fraction: float = -1.0

    def __post_init__(self) -> None:
        allowed = {s.value for s in Status}
        if isinstance(self.status, Status):
            self.status = self.status.value
        if self.status not in allowed:
            raise ValueError(f"EvalResult.status must be one of {sorted(allowed)}, got {self.status!r}")

    @property
    def ok(self) -> bool:
        return self.status == Status.OK.value

    @property
    def speedup_eager(self) -> float | None:
        return self.timing.speedup_eager.point if self.timing else None

    @property
    def speedup_compile(self) -> float | None:
        return self.timing.speedup_compile.point if self.timing and self.timing.speedup_compile else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "reward": float(self.reward),
            "message": self.message,
            "task_id": self.task_id,
            "format": self.format,
            "backend": self.backend,
            "stage_ms": {k: float(v) for k, v in self.stage_ms.items()},
            "compile_log": self.compile_log,
            "build_cached": self.build_cached,
            "trials": [t.to_dict() for t in self.trials],
            "timing": self.timing.to_dict() if self.timing else None,
            "violations": [v.to_dict() for v in self.violations],
            "isolation": dict(self.isolation),
            "nvml": [dict(r) for r in self.nvml],
            "log": list(self.log),
            "contended": bool(self.contended),
            "device_peak_bytes": int(self.device_peak_bytes),
            "device_free_fraction": float(self.device_free_fraction),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "EvalResult":
        """Inverse of to_dict. Raises ValueError naming an unknown or missing field or a bad status."""
        _check_keys(cls, d)
        d = dict(d)
        d["trials"] = [TrialResult.from_dict(t) for t in d.get("trials", [])]
        d["violations"] = [Violation.from_dict(v) for v in d.get("violations", [])]
        d["timing"] = TimingStats.from_dict(d["timing"]) if d.get("timing") is not None else None
        return cls(**d)

    @classmethod
    def failure(cls, status: Status | str, message: str, **kw: Any) -> "EvalResult":
        """A failed evaluation: reward -1 (internal_error too: the caller should retry rather than learn)."""
        return cls(status=status if isinstance(status, str) else status.value, reward=FAILED_REWARD,
                   message=message, **kw)
