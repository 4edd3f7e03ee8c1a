"""`SandboxConfig`: every knob of the sandbox, typed and validated (YAML presets via cuda_agent.config)."""

from __future__ import annotations

import dataclasses
import os
import tempfile
from pathlib import Path

BACKENDS = ("auto", "cpu", "cuda")
FORMATS = ("cubin", "extension", "cpu")
ISOLATION = ("auto", "namespaces", "none")


def _default_cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return str(Path(base) / "cuda-agent" / "sandbox")


@dataclasses.dataclass
class SandboxConfig:
    """Configuration of the build / verify / profile / reward pipeline.

    Fields (units in the names; defaults in parentheses):
    """

    # --- where and what
    backend: str = "auto"
    """"cpu", "cuda", or "auto" (cuda when torch sees a GPU, else cpu)."""
    cuda_arch: str = ""
    """nvcc target for cubin/extension builds (e.g. "sm_90a"); "" = from the GPU, "sm_90a" when none is visible."""
    default_cuda_arch: str = "sm_90a"
    """Target used when cuda_arch is "" and no GPU can be queried (compile-only hosts, CI)."""
    cache_dir: str = dataclasses.field(default_factory=_default_cache_dir)
    """Build cache root (content-hash keyed), kept private to the trusted side (mode 0700)."""
    work_root: str = ""
    """Parent folder of per-evaluation workspaces; "" = <tmp>/cuda-agent-sandbox."""
    keep_workspaces: bool = False
    """Keep each workspace after the evaluation (debugging)."""

    # --- build
    cc: str = "gcc"
    """Host C compiler (cpu format, .c files)."""
    cxx: str = "g++"
    """Host C++ compiler (cpu format, .cpp/.cc files; links the shared library)."""
    cpu_cflags: str = "-O3 -march=native -fPIC -fopenmp"
    """Flags for host kernels (cpu format)."""
    nvcc: str = "nvcc"
    """The CUDA compiler."""
    nvcc_flags: str = "-O3 -std=c++17 -lineinfo"
    """Extra flags for nvcc -cubin (the arch is added from cuda_arch)."""
    compile_log_max_chars: int = 4000
    """Compiler diagnostics are truncated to this many characters."""
    allow_blas: bool = False
    """cpu format: allow BLAS symbols (cblas_*, sgemm_, ...) in the built library."""

    # --- verification
    static_checks: bool = True
    """Run the static checks of model_new.py and kernel sources (off only to exercise the runtime defences in tests)."""
    runtime_monitor: bool = True
    """Run the in-process defences of the candidate worker (sandbox.integrity: audit hook, thread guard); off only
    to exercise the operating-system confinement underneath them in tests."""
    num_trials: int = 5
    """Fresh-seed input sets the candidate must match the reference on."""
    atol: float = -1.0
    """Absolute tolerance; < 0 = the task's (default 1e-2)."""
    rtol: float = -1.0
    """Relative tolerance; < 0 = the task's (default 1e-2)."""
    poison_outputs: bool = True
    """Fill memory that forward allocates with NaN / a sentinel during verification."""
    check_timed_outputs: bool = True
    """Kept for configuration compatibility: timed outputs are always checked (sandbox.reference_worker._profile:
    every timed call at random positions, one call per repetition in full)."""
    shape_variants: bool = True
    """Also verify on other shapes where the task declares shape parameters (each parameter roughly halved and made
    odd, so sizes are not multiples of typical block sizes)."""
    shape_variant_trials: int = 1
    """Input sets per shape variant."""
    value_variant: bool = True
    """One more trial with floating-point inputs scaled by a random factor in [2, 4) (value-range shortcuts)."""
    precision_median_rel_fp32: float = 1e-4
    """Largest median relative error of a float32 output (sandbox.verify.precision_shortfall); 0 = no check."""
    timed_input_bytes_max: int = 256 * 1024 * 1024
    """Profile: bytes of fresh input sets per repetition (one set per timed call); bounds calls per repetition."""
    full_checks: float = 1.0
    """Profile: expected number of repetitions whose timed outputs are checked in full (one call each, chosen after
    the calls; at least one per evaluation); every timed call is checked at 64 random positions per output."""
    fresh_calls_per_rep_max: int = 16
    """Profile: at most this many timed calls (each on its own fresh input set) per repetition; with per-call timing
    (CUDA events, perf_counter) more calls only add input generation and transfer."""
    prefetch_input_bytes_max: int = 1024 * 1024 * 1024
    """Profile: bytes of fresh input sets the trusted worker makes ahead, in a background thread, while the
    candidate starts, loads and is verified (never while anything is timed: the thread is stopped first); sets past
    this are made per repetition. 0 = make every set per repetition."""
    shared_inputs: bool = True
    """Send input sets to the candidate through a sealed shared-memory segment (sandbox.shm) instead of msgpack
    bytes / spill files; off = always the wire."""

    build_only: bool = False
    """Stop after the static checks and the build (the agent's `compile` tool): status ok with reward 0 when it
    built; the reference, load, verify and profile stages do not run."""

    # --- profiling and reward
    profile: bool = True
    """Run the profile stage (False: reward is 0 for any correct solution)."""
    use_compile: bool = True
    """Time torch.compile as a baseline (milestones 2 and 3 need it)."""
    compile_mode: str = "default"
    """torch.compile mode for the baseline ("default", "reduce-overhead", "max-autotune")."""
    warmup_calls: int = 3
    """Untimed calls of each implementation before timing, in one request of the candidate: at least this many and
    at least one repetition's calls (sandbox.reference_worker.warmup_sets), so the first timed repetition's outputs
    land on memory the process has touched. 0 = no warm-up."""
    reps: int = 20
    """Interleaved repetitions (eager, compile, candidate in rotating order) per evaluation."""
    early_stop_reps: int = 8
    """Profile: from this many repetitions on, the profile ends as soon as the milestone is settled: the
    early_stop_level intervals of the speed-ups (the candidate's samples charged as at the end) lie clear of every
    threshold that decides the level (sandbox.stats.milestone_settled). The one full check of the timed outputs
    falls in a random one of these first repetitions. 0 = always run `reps`."""
    early_stop_level: float = 0.99
    """Profile: the confidence level of the intervals that may end a profile early (above ci_level: a level the
    early look settles stays the same on the final ci_level intervals)."""
    calibration_reuse_evals: int = 0
    """Profile: a task's harness costs (sandbox.reference_worker._calibrate: the fixed and per-call cost of a time
    request, measured in a fresh candidate process before its solution's import) are reused by up to this many
    later evaluations of the task on the same worker. Each of those still measures its own round trip and runs 3
    unmeasured rounds of both request sizes before the import; these time the candidate's gate latency and touch
    its memory. The costs are kept per calls, format, timing gate and confinement. A calibration that ran without
    the timing lock is never reused.

    A full calibration moves 6 x (1 + calls) input sets: 4.9-13 s an evaluation for the fleet bench's x256 corpus
    tasks on the H200, all of it with the GPU's timing lock held (benchmarks/RESULTS.md, calibration_bench.py).
    Reuse saves about half of that.

    Off (0) by default. With fewer warm-up rounds, reuse left an honest solution's first timed repetitions slow
    on the CPU box. Costs measured at one host load and reused at another shift the charge either way. The
    3-round version has not been measured on a GPU. 0 = measure in every evaluation."""
    calibration_reuse_min_ms: float = 500.0
    """Profile: only a calibration that took at least this long (ms) is reused (calibration_reuse_evals). A short
    one is measured again in every evaluation: it costs little and follows changes of the host's load (harness
    costs measured on an idle host and reused on a loaded one would charge an honest solution the difference)."""
    calibration_calls_max: int = 4
    """Profile: the harness calibration's larger request times min(this, the profile's calls per repetition) calls
    (its smaller one times 1; their difference gives the per-call cost). 4 kept the calibration at 111-202 ms of an
    elementwise evaluation on the H200, where 16 cost 140-510 ms; the per-call figure at 4 calls is noisier
    (0.11-0.36 against 0.15-0.23 ms on the H200, benchmarks/RESULTS.md). Must be >= 1."""
    min_rep_ms: float = 2.0
    """Calls per repetition are chosen so that one repetition of eager lasts at least this long."""
    max_calls_per_rep: int = 1000
    """Upper bound on calls per repetition."""
    bootstrap_samples: int = 2000
    """Bootstrap resamples for the speed-up confidence intervals."""
    ci_level: float = 0.90
    """Two-sided confidence level of the speed-up intervals; a milestone needs the lower bound to clear."""
    faster_than_eager: float = 1.0
    """Milestone 1: speed-up over eager whose CI lower bound must exceed this."""
    faster_than_compile: float = 1.0
    """Milestone 2: milestone 1 and speed-up over torch.compile whose lower bound exceeds this."""
    top_margin: float = 1.05
    """Milestone 3: lower bounds over both eager and torch.compile at least this (5% faster)."""
    timing_slack_ms: float = 0.25
    """Profile: how far (ms, plus timing_slack_rel of the median repetition's estimate) a repetition's in-process
    figure may fall short of the trusted wall-clock estimate (sandbox.timing.trusted_estimate) before the
    repetition is charged its shortfall beyond this slack (sandbox.timing.charge_shortfall): the most a candidate
    can gain by under-reporting, per repetition, is this + timing_slack_rel x the estimate + timing_slack_harness_rel
    x the calibrated harness cost of a repetition, plus whatever unpacking time the candidate reports beyond its
    real cost, which trusted_estimate believes up to 3 x the trusted side's packing + 0.5 ms."""
    timing_slack_rel: float = 0.03
    """Profile: the relative part of the timing slack (fraction of the median repetition's trusted estimate)."""
    timing_slack_harness_rel: float = 0.25
    """Profile: a part of the timing slack proportional to the harness's calibrated cost of one repetition (this
    fraction of fixed + calls x per-call cost, sandbox.reference_worker._calibrate). On the H200 the harness's work
    between an honest solution's calls ran 7-31% slower than between the calibration's no-op calls (session 12,
    benchmarks/RESULTS.md), which the rule charged to the solution: with this part at 0 the median of an honest
    0.076 ms solution varied by a CV of 23.9-29.4% over 8 profiles; at 0.25, by 0.18-0.26% (session 13, two runs).
    It is also what a solution could then hide per repetition beyond timing_slack_ms + timing_slack_rel x the
    estimate: at 0.25, with the H200's calibrated 0.6-1.5 ms + calls x 0.15-0.40 ms of harness cost (32
    calibrations), 0.38-0.62 ms more for a 3-call repetition (0.13-0.21 ms a call); extrapolated, 0.9-1.8 ms for a
    16-call one (0.06-0.11 ms a call). 0 = off."""
    l2_flush_bytes: int = 256 * 1024 * 1024
    """CUDA: bytes written before each repetition to flush the L2 cache (0 = no flush)."""
    timing_gate: bool = True
    """CUDA: hold the stream behind a waiting kernel while each timed call is enqueued (sandbox.timing_gate), so
    the CUDA events measure the GPU's run of the call rather than the host's launch overhead; the same for eager,
    torch.compile and the candidate. False: the events include the host's time to enqueue the call."""
    timing_gate_extension: bool = False
    """CUDA: gate the extension format too (its baselines then as well). Off by default: its C++ host code could
    compute on the CPU behind the gate (bounded by timing_gate_native_host_allowance_ms), and the gated extension
    path has not yet run on an H200; the extension format is timed ungated, baselines included."""
    timing_gate_flush: bool = True
    """CUDA, gated: the gate flushes L2 itself after its release (its blocks zero the L2 flush buffer before the start
    event) in place of the flush before the call, so that what a copy engine read into L2 while the gate held the
    stream is evicted (sandbox.timing_gate). The gate's latency then includes the flush (0.075 ms against 0.014 ms
    on the H200, session 26), and so does what a gated call's host-side figure forgives. Ungated calls (the
    extension format unless timing_gate_extension, a label whose gate expired twice, timing_gate off) still zero the
    buffer before each call. False: the flush runs before every call, and a copy on another stream while the gate
    holds can bring the inputs back into L2."""
    timing_gate_timeout_ms: float = 20.0
    """CUDA, gated: the longest a gate holds the stream; a call that synchronises while held waits this long and
    counts its whole wall clock; an implementation whose gate expired twice is timed ungated for the rest of the
    profile."""
    timing_gate_host_allowance_ms: float = 1.0
    """CUDA, gated, cubin format (no host code of the solution's own): the host time per call inside the call
    (Python, launches) that is not counted; beyond it, host time counts. The gate blocks every SM, so nothing can
    compute on the GPU behind it, and a cubin solution's Python cannot compute on the host (the dispatch guard and
    the import allow-list): what this allows is launch overhead. It also bounds the trusted side's cross-check
    (reference_worker._event_floor): a solution that defeated the in-process timer could claim at most about 2x
    plus this much per call."""
    timing_gate_native_host_allowance_ms: float = 0.1
    """CUDA, gated, extension format (timing_gate_extension): as timing_gate_host_allowance_ms, smaller, since the
    solution's C++ host code could compute on the CPU while the gate holds the GPU."""
    idle_cpu_limit_s: float = 0.1
    """CPU seconds (user + system, every thread and child) the candidate's process may use, summed over one
    evaluation, while it has no request to answer (between a reply and the next request, as the trusted side reads
    /proc); more is `background_work` (forbidden): threads of its own, native ones included, that run while the
    baselines are timed. 0 = not checked."""
    thread_filter: bool = True
    """CPU backend with cpu_threads 1 (with more, OpenMP teams of the solution's own need threads; the CPU-time checks
    cover them): once the solution is loaded (before its import), any thread, process or timer its process starts
    kills it (sandbox.thread_filter: a seccomp filter; `background_thread`, forbidden), and a thread the load left
    running is refused: a thread of its own could run work where no clock looks. Linux x86_64 / aarch64; elsewhere
    logged and skipped. The CUDA backend: thread_filter_cuda."""
    thread_filter_cuda: bool = True
    """The same filter on the CUDA backend, also with cpu_threads 1 only (torch's intra-op pool would start threads
    after the import; with more, the hole below is open): before the import for the formats the sandbox builds,
    after the load for a load_inline solution, where no CPU-time check looks and a native thread could launch GPU
    work between timed calls (tests/integrity/solutions/gpu_ext_overlap). On by default since session 30, when its
    gpu tests (tests/integrity/test_integrity_red5.py, tests/sandbox/test_sandbox_gpu.py) and the rest of the gpu
    suite ran with it on, on an H100."""

    # --- threads
    cpu_threads: int = 1
    """torch intra-op threads and OMP_NUM_THREADS, for reference and candidate alike (same footing)."""
    verify_threads: int = 0
    """CUDA backend: torch intra-op threads of the trusted worker, which compares outputs on CPU copies (the
    reference's never go back to the device while solution code runs); 0 = every core it may run on. compare() of
    2^27 float32 elements took 6.2 s on one thread of the 2-core CPU box, so ~25 s for a 2 GiB output (extrapolated;
    the H200's GPU-sized evaluations took ~160 s). Used from the reference stage to the end of verification and
    around each profile check; eager and torch.compile are timed with cpu_threads. The CPU backend uses cpu_threads."""

    # --- time limits (wall clock, per stage)
    build_timeout_s: float = 120.0
    """cpu/cubin build."""
    extension_build_timeout_s: float = 900.0
    """torch.utils.cpp_extension builds (also load_inline at import)."""
    load_timeout_s: float = 60.0
    """Start of the candidate worker, import of model_new.py, ModelNew construction and weights."""
    trial_timeout_s: float = 30.0
    """One verification trial (one forward call plus transfer)."""
    profile_timeout_s: float = 300.0
    """The whole profile stage of the candidate."""
    reference_timeout_s: float = 600.0
    """Reference side of one evaluation (inputs, reference outputs, torch.compile's first call)."""

    # --- isolation
    isolation: str = "auto"
    """"namespaces" (unshare: own pid/net/mount namespaces, read-only root, uid drop), "none", or "auto"."""
    sandbox_uid: int = 65534
    """uid/gid the candidate runs as under namespace isolation (-1 keeps root, without capabilities)."""
    rlimit_cpu_s: int = 900
    """RLIMIT_CPU of the candidate process (seconds of CPU time)."""
    rlimit_fsize_bytes: int = 4 * 1024 * 1024 * 1024
    """RLIMIT_FSIZE: largest file the candidate may write. Outputs travel back through files of the spill folder
    (sandbox.wire), so this must exceed the largest output: the GPU split's tasks have outputs of up to 2 GiB."""
    rlimit_nproc: int = 512
    """RLIMIT_NPROC: processes + threads of the sandbox uid."""
    rlimit_nofile: int = 1024
    """RLIMIT_NOFILE: open files."""
    rlimit_as_bytes: int = 8 * 1024**3
    """RLIMIT_AS (address space) of the candidate on the cpu backend (0 = unlimited; never applied with CUDA, whose
    mappings are huge): memory exhaustion fails inside the candidate instead of waking the OOM killer."""
    max_message_bytes: int = 2 * 1024**3
    """Largest message the trusted side accepts from the candidate."""

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"SandboxConfig.backend must be one of {BACKENDS}, got {self.backend!r}")
        if self.isolation not in ISOLATION:
            raise ValueError(f"SandboxConfig.isolation must be one of {ISOLATION}, got {self.isolation!r}")
        if self.compile_mode not in ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"):
            raise ValueError(f"SandboxConfig.compile_mode: unknown torch.compile mode {self.compile_mode!r}")
        if self.cuda_arch and not self.cuda_arch.startswith(("sm_", "compute_")):
            raise ValueError(f"SandboxConfig.cuda_arch must look like 'sm_90a', got {self.cuda_arch!r}")
        for name in ("num_trials", "reps", "bootstrap_samples", "max_calls_per_rep", "compile_log_max_chars",
                     "cpu_threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"SandboxConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.warmup_calls < 0:
            raise ValueError("SandboxConfig.warmup_calls must be >= 0")
        if self.verify_threads < 0:
            raise ValueError(f"SandboxConfig.verify_threads must be >= 0 (0: every core), got {self.verify_threads}")
        for name in ("build_timeout_s", "extension_build_timeout_s", "load_timeout_s", "trial_timeout_s",
                     "profile_timeout_s", "reference_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"SandboxConfig.{name} must be > 0 seconds, got {getattr(self, name)}")
        if not 0.5 <= self.ci_level < 1.0:
            raise ValueError(f"SandboxConfig.ci_level must be in [0.5, 1), got {self.ci_level}")
        if not (self.faster_than_eager > 0 and self.faster_than_compile > 0 and self.top_margin > 0):
            raise ValueError("SandboxConfig milestone thresholds must be > 0")
        if self.calibration_reuse_evals < 0:
            raise ValueError(f"SandboxConfig.calibration_reuse_evals must be >= 0 (0 = calibrate every evaluation), "
                             f"got {self.calibration_reuse_evals}")
        if self.calibration_calls_max < 1:
            raise ValueError(f"SandboxConfig.calibration_calls_max must be >= 1, got {self.calibration_calls_max}")
        if self.calibration_reuse_min_ms < 0:
            raise ValueError(f"SandboxConfig.calibration_reuse_min_ms must be >= 0, got {self.calibration_reuse_min_ms}")
        if self.early_stop_reps < 0:
            raise ValueError(f"SandboxConfig.early_stop_reps must be >= 0 (0 = always run reps), got {self.early_stop_reps}")
        if not self.ci_level <= self.early_stop_level < 1:
            raise ValueError(f"SandboxConfig.early_stop_level must be in [ci_level, 1), got {self.early_stop_level}")
        if self.min_rep_ms < 0:
            raise ValueError("SandboxConfig.min_rep_ms must be >= 0")
        if self.idle_cpu_limit_s < 0:
            raise ValueError(f"SandboxConfig.idle_cpu_limit_s must be >= 0 (0 = not checked), got {self.idle_cpu_limit_s}")
        if not self.timing_gate_timeout_ms > 0 or not (self.timing_gate_host_allowance_ms >= 0
                                                       and self.timing_gate_native_host_allowance_ms >= 0):
            raise ValueError("SandboxConfig.timing_gate_timeout_ms must be > 0, and timing_gate_host_allowance_ms "
                             "and timing_gate_native_host_allowance_ms >= 0")
        if self.timing_slack_ms < 0 or not 0 <= self.timing_slack_rel < 1:
            raise ValueError("SandboxConfig.timing_slack_ms must be >= 0 and timing_slack_rel in [0, 1)")
        if not 0 <= self.timing_slack_harness_rel <= 1:
            raise ValueError("SandboxConfig.timing_slack_harness_rel must be in [0, 1], got "
                             f"{self.timing_slack_harness_rel}")

    @property
    def workspaces_dir(self) -> Path:
        return Path(self.work_root) if self.work_root else Path(tempfile.gettempdir()) / "cuda-agent-sandbox"

    def tolerances(self, task_atol: float, task_rtol: float) -> tuple[float, float]:
        """(atol, rtol) to use: the config's when set (>= 0), else the task's."""
        return (self.atol if self.atol >= 0 else task_atol, self.rtol if self.rtol >= 0 else task_rtol)


def gate_allowance_ms(cfg: SandboxConfig, fmt: str) -> float:
    """The timing gate's host allowance (ms per call) for a solution format: the extension format has host code
    of its own (timing_gate_native_host_allowance_ms), the others not (timing_gate_host_allowance_ms)."""
    return cfg.timing_gate_native_host_allowance_ms if fmt == "extension" else cfg.timing_gate_host_allowance_ms
