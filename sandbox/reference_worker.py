"""The trusted worker: a long-lived process per device that owns the reference side of every evaluation.

What it keeps (per task content hash, backend and shape overrides; LRU): the reference module executed from the
task's pristine source (never from the workspace copy), the reference model with its seeded initial weights,
its state_dict, and its `torch.compile` graph, whose first call costs 15-18 s on the 2-core CPU machine and
seconds on a GPU host. It also keeps the last baseline distributions, for inspection only.

Baseline policy: **re-time interleaved**. Eager and torch.compile are re-timed in every evaluation, interleaved
with the candidate in rotating order, rather than reusing a cached baseline distribution with a drift check.
Why: the milestone decision rests on the lower bound of a ratio whose top margin (5%) is of the order of timing
noise; pairing the three measurements repetition by repetition cancels drift (GPU clocks and temperature, other
tenants on a CPU host) that a cached distribution would fold into the ratio. It costs a few extra repetitions of
the baselines per evaluation (milliseconds to a second for tasks in the paper's 1-100 ms window); the expensive
part, compiling the graph, stays cached.

One evaluation (`run_job`):
1. draw `num_trials` seeds from the OS (`secrets`), make each input set with `torch.manual_seed(seed);
   get_inputs()` (on CUDA under `torch.device(device)`: the sets are made on the device, `TaskState.make_inputs`),
   and compute the reference outputs, all before any solution code exists (from a task's second
   evaluation on, while the candidate worker confines itself and builds its harness); estimate eager's
   time per call (`ProfilePlan`), then hand what the rest of the evaluation needs (the value-range and
   shape-variant trials' inputs and reference outputs, the profile's fresh input sets) to the `Prefetch` thread,
   which makes them while the candidate starts, loads and is verified, and in the profile's untimed parts: it
   is held idle around every timed region, and makes nothing the candidate gets before it needs it;
2. start the candidate worker (sandbox.candidate) confined by sandbox.jail, with its input segment (sandbox.shm: a
   memfd the trusted side sizes and seals before `setup`, read-only to the candidate), send it the init inputs
   and the reference state_dict (`load`), then each input set (`run`), and compare (sandbox.verify, with a
   precision budget on the median relative error); every forward must launch the solution's own kernels
   (`Evidence`); then one trial on inputs scaled by a random factor (value-range shortcuts) and, where the task
   declares shape parameters, trials on other shapes (sizes not multiples of block sizes), after which the
   default-shape model is loaded again;
   Before `load` (no solution code yet), `_calibrate` measures the round trip of an empty request and the
   harness's own cost per timed call (sandbox.timing: nothing the solution's process answers later is believed
   about it);
3. if all trials pass, profile (`_profile`): per repetition, fresh input sets from fresh seeds, one per timed
   call, the same for eager, torch.compile and the candidate in rotating order; the candidate gets a
   repetition's sets (copied into its segment) with the time request that times them, never before; the
   candidate's in-process timing is accepted only when it agrees with this process's wall clock around the
   request, less the calibrated costs (sandbox.timing.trusted_estimate, agrees_with_estimate, and the median
   slack); every timed call's outputs (copied by the candidate's harness right after the call) are checked at
   positions chosen after the calls, and one call's in full, against eager's outputs on the same inputs; then
   speed-ups, intervals and the milestone (sandbox.stats). From `early_stop_reps` repetitions on, the profile ends
   once the milestone is settled (its `early_stop_level` intervals clear every threshold that decides it);
4. kill the candidate's process tree, whatever happened.

What the trusted side gives the candidate, and when: input tensors and weights, never a seed, a reference output
or the reference module; inputs only with the request that uses them (a trial's set with its `run`, a timed
repetition's sets with its `time`). Its own copies of the inputs (the reference's and the baselines') stay in this
process's private memory; it never reads the segment back. Large tensors spill into the evaluation's spill folder
(sandbox.workspace: beside the workspace, in the root-owned workspaces folder), which this process reaches only
through a directory fd opened before the candidate exists (sandbox.wire.SpillDir: a file it reads must be a
regular file of the candidate's uid with one link; a rejected one is left alone).
A stage that runs past its limit kills the candidate and yields `timeout`; a candidate that dies (segfault,
abort, sticky CUDA error) yields `runtime_error`; the trusted worker itself never runs candidate code.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import gc
import json
import math
import os
import platform
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import types
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterator

import torch

from sandbox import shm as shm_mod
from sandbox import wire
from sandbox import thread_filter
from sandbox.config import SandboxConfig, gate_allowance_ms
from sandbox.jail import (DEFAULT_HIDE, MALLOC_ENV, PASSED_ENV, JailSpec, candidate_expose, command_prefix,
                          set_rlimits, toolkit_dirs, trusted_roots)
from sandbox.result import OOM_PATTERN, Status, TimingStats, TrialResult, Violation
from sandbox.service_lock import DeviceTimingLock, SharedUse
from sandbox.stats import bootstrap_speedup, distribution, milestone, milestone_settled
from sandbox.timing import Timer, agrees_with_estimate, charge_shortfall, l2_flush_buffer, trusted_estimate
from sandbox.verify import compare, precision_shortfall
from sandbox.timing_gate import gate_cubin, load_gate
from tasks.reference import draw_inputs

REPO_ROOT = Path(__file__).resolve().parent.parent
_MAX_TASKS = 32
_RNG_LOCK = threading.Lock()  # torch's global generator: seeding and get_inputs() of one set at a time
SPARE_START_TIMEOUT_S = 300.0  # a spare candidate worker's own start (python + torch import), trusted work
# The longest the next evaluation's first timed section waits for the previous candidate's process tree to be gone
# (WorkerPool.await_teardown). A killed candidate frees its memory before it closes its pipes (the kernel's do_exit:
# exit_mm before exit_files), so the end of its reply pipe marks the end of its teardown: 436 ms for a candidate
# holding 5 GB on the CPU box (session 13's review), during which the next calibration came out lower.
TEARDOWN_WAIT_S = 5.0
DYING_MAX = 16  # retired candidates' reply pipes kept for that wait at most (the oldest is let go first)


class StageFailure(Exception):
    """Ends an evaluation early with a status and a message (and optional violations)."""

    def __init__(self, status: Status, message: str, violations: list[Violation] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.violations = violations or []


# ----------------------------------------------------------------------------------------------------- reference
class TaskState:
    """The reference side of one task on one device (see module doc)."""

    def __init__(self, reference: str, task_id: str, device: str, shape_overrides: dict[str, int] | None = None):
        self.device = device
        mod = types.ModuleType(f"cuda_agent_reference_{abs(hash(reference)) % 10**12}")
        mod.__file__ = "model.py"
        exec(compile(reference, f"<reference {task_id}>", "exec"), mod.__dict__)  # trusted: the task's own source
        for k, v in (shape_overrides or {}).items():
            if k not in mod.__dict__:
                raise ValueError(f"task {task_id}: shape parameter {k!r} is not a module-level name of the reference")
            mod.__dict__[k] = v
        for name in ("Model", "get_inputs", "get_init_inputs"):
            if not hasattr(mod, name):
                raise ValueError(f"task {task_id}: the reference defines no {name}")
        self.module = mod
        self.init_inputs = list(mod.get_init_inputs())
        self.init_seed = secrets.randbits(62)
        torch.manual_seed(self.init_seed)
        self.model = mod.Model(*self.init_inputs).to(device).eval()
        self.state_dict = {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()}
        self.compiled: Any = None
        self.compile_error = ""
        self.compile_ready = False
        self.last_baselines: dict[str, Any] = {}
        self.segment_bytes = 0  # input segment size the last evaluation needed (0: not evaluated yet)
        self.inputs_on_device = True  # CUDA: get_inputs() runs under torch.device(device) (see make_inputs)
        self.mutates_inputs = False  # the reference writes its inputs in place (seen by reference_outputs)
        # harness costs measured by an earlier evaluation (_calibrate): (key: calls, format, gated, jailed;
        # fixed_ms, per_call_ms, uses left)
        self.calibration: tuple[tuple, float, float, int] | None = None

    def make_inputs(self, seed: int) -> list:
        """The input set for a seed (the candidate gets copies of these tensors, never the seed).

        On CUDA the set is made on the device: get_inputs() runs under `torch.device(device)`, so its tensor
        factories (torch.randn, torch.rand, ...) draw from the device's generator. A CPU torch.randn costs about
        1.5 ms per MiB (8 MiB: 13 ms on the 2-core CI host), and the profile makes one fresh set per timed call
        (hundreds per evaluation); on the device a set costs microseconds. A get_inputs() that cannot run under
        the device context (it calls .numpy(), say) is run on the CPU, for this task from then on
        (`inputs_on_device` False). On the CPU backend: CPU tensors, as get_inputs() makes them."""
        with _RNG_LOCK:
            if not self.device.startswith("cuda"):
                torch.default_generator.manual_seed(seed)  # torch.manual_seed would also queue a CUDA seeding
                return list(self.module.get_inputs())
            # every generator seeded, the device's and the CPU's; a get_inputs() that needs the CPU is drawn there
            # for this task from now on
            inputs, self.inputs_on_device = draw_inputs(self.module.get_inputs, seed, self.device,
                                                        self.inputs_on_device)
            return list(inputs)

    def to_device(self, v: Any) -> Any:
        """A copy of input set v on the device, private to its user: on CUDA a tensor already there is copied too
        (a reference that writes its inputs in place must not change the set the candidate is sent); on the CPU
        backend CPU tensors are used as they are, unless the reference writes its inputs in place
        (`mutates_inputs`): then they are copied too."""
        if isinstance(v, torch.Tensor):
            return v.to(self.device, copy=v.is_cuda or self.mutates_inputs)
        if isinstance(v, (list, tuple)):
            return type(v)(self.to_device(x) for x in v)
        return v

    def reference_outputs(self, inputs_dev: list) -> Any:
        """The reference's outputs on copies of inputs_dev (CPU tensors); a reference that writes its inputs in place
        is noted (`mutates_inputs`: every baseline call then gets private copies, see to_device and _profile)."""
        ins = [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs_dev]
        with torch.no_grad():
            out = self.model(*ins)
        if not self.mutates_inputs:
            self.mutates_inputs = any(isinstance(a, torch.Tensor) and not torch.equal(a, b)
                                      for a, b in zip(ins, inputs_dev))
        cpu = _to_cpu(out)
        scrub_device(out)
        return cpu

    def compiled_model(self, mode: str, example: list) -> Any:
        """The torch.compile'd reference (compiled on first use with `example`); None if compilation fails."""
        if not self.compile_ready:
            self.compile_ready = True
            try:
                c = torch.compile(self.model, mode=mode)
                with torch.no_grad():
                    c(*example)
                self.compiled = c
            except Exception as e:  # noqa: BLE001 - record and go on without the compile baseline
                self.compile_error = f"torch.compile failed: {type(e).__name__}: {str(e)[:300]}"
        return self.compiled


def scrub_device(v: Any) -> None:
    """Overwrite device tensors holding reference results before they are freed: should the caching allocator
    ever hand the memory back to the driver, another process (a candidate) cannot find an expected output in it."""
    for t in _tensor_list(v):
        if t.device.type == "cuda" and t.numel():
            if t.is_floating_point() or t.is_complex():
                t.fill_(float("nan"))
            else:
                t.zero_()


def _to_cpu(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return v.detach().cpu()
    if isinstance(v, (list, tuple)):
        return type(v)(_to_cpu(x) for x in v)
    return v


# ----------------------------------------------------------------------------------------------------- candidate
def _pdeathsig() -> None:
    try:
        libc = ctypes.CDLL(None)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG: die with the trusted worker
    except OSError:
        pass


def _worker_env(cfg: SandboxConfig) -> dict[str, str]:
    """Environment of candidate workers and the zygote: nothing of the trusted side's beyond what is needed."""
    env = {
        **MALLOC_ENV,
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": os.pathsep.join([str(REPO_ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]),
        "HOME": tempfile.gettempdir(),
        "OMP_NUM_THREADS": str(cfg.cpu_threads),
        # the OpenMP thread limit: no num_threads clause or omp_set_* call in a kernel can go past it, so a kernel
        # gets no more threads than the baselines (torch.set_num_threads(cpu_threads)) do
        "OMP_THREAD_LIMIT": str(cfg.cpu_threads),
        "MKL_NUM_THREADS": str(cfg.cpu_threads),
        "OPENBLAS_NUM_THREADS": "1",  # OpenBLAS starts a thread pool at import otherwise (the zygote must fork single-threaded)
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONHASHSEED": "0",
    }
    env.update({k: os.environ[k] for k in PASSED_ENV if k in os.environ})
    return env


class Zygote:
    """Client of a sandbox.zygote fork server for one (device, namespaces) (see sandbox/zygote.py)."""

    def __init__(self, device: str, cfg: SandboxConfig, namespaces: bool):
        import socket

        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sandbox.zygote", "--ctl", str(b.fileno()), "--device", device,
             "--threads", str(cfg.cpu_threads), "--namespaces", "1" if namespaces else "0"],
            pass_fds=(b.fileno(),), stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT, cwd="/",
            env=_worker_env(cfg), start_new_session=True, preexec_fn=_pdeathsig)
        b.close()
        self.sock = a
        self.ready = False
        self.broken = False

    def _line(self, timeout_s: float) -> str:
        self.sock.settimeout(timeout_s)
        buf = b""
        while not buf.endswith(b"\n"):
            chunk = self.sock.recv(64)
            if not chunk:
                raise EOFError("zygote exited")
            buf += chunk
        return buf.decode().strip()

    def spawn(self, fd_in: int, fd_out: int, log_fd: int, shm_fd: int | None = None) -> int | None:
        """Fork a candidate worker; its intermediate's pid, or None when the zygote cannot (use a slow start)."""
        import socket

        if self.broken:
            return None
        try:
            if not self.ready:
                if self._line(SPARE_START_TIMEOUT_S) != "ready":
                    raise EOFError("zygote did not get ready")
                self.ready = True
            socket.send_fds(self.sock, [b"spawn"], [fd_in, fd_out, log_fd] + ([shm_fd] if shm_fd is not None else []))
            pid = int(self._line(30.0))
        except (OSError, EOFError, ValueError):
            self.broken = True
            return None
        return pid if pid > 0 else None

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()
        self.log.close()


_GATES: dict[str, Any] = {}
_GATE_CUBINS: dict[tuple, bytes | None] = {}  # (nvcc, cuda_arch, default_cuda_arch, cache_dir) -> gate_cubin's answer


def gate_setup(cfg: SandboxConfig, device: str, fmt: str = "cubin") -> dict | None:
    """The timing gate's part of a candidate's `setup` (cubin bytes and limits), or None: no gate (the CPU,
    SandboxConfig.timing_gate off, the extension format without timing_gate_extension, or no nvcc)."""
    if not (cfg.timing_gate and device.startswith("cuda")) or (fmt == "extension" and not cfg.timing_gate_extension):
        return None
    key = (cfg.nvcc, cfg.cuda_arch, cfg.default_cuda_arch, cfg.cache_dir)
    if key not in _GATE_CUBINS:  # once per process: detect_arch asks NVML, gate_cubin runs nvcc --version
        from sandbox.build import detect_arch

        _GATE_CUBINS[key] = gate_cubin(cfg.nvcc, detect_arch(cfg), cfg.cache_dir)
    cubin = _GATE_CUBINS[key]
    if cubin is None:
        return None
    return {"cubin": cubin, "timeout_ms": cfg.timing_gate_timeout_ms, "allowance_ms": gate_allowance_ms(cfg, fmt),
            "flush": bool(cfg.timing_gate_flush)}


def trusted_timer(cfg: SandboxConfig, cuda: bool, device: str, flush: Any, fmt: str = "cubin") -> Timer:
    """A Timer for this (trusted) process: gated as the candidate's is (the same gate policy and host allowance for
    eager, torch.compile and a solution of format `fmt`), the gate loaded once per device."""
    gate = None
    g = gate_setup(cfg, device, fmt) if cuda else None
    if g is not None:
        key = f"{device}/{g['timeout_ms']}"
        if key not in _GATES:
            _GATES[key] = load_gate(g["cubin"], g["timeout_ms"], device)
        gate = _GATES[key]
    return Timer(cuda, flush, gate, gate_allowance_ms(cfg, fmt), gate_flush=bool(g and g["flush"]))


class CandidateProcess:
    """A candidate worker with request/reply over pipes, killed with its whole tree by `kill()`.

    Forked from the zygote when there is one (milliseconds), else started as a fresh Python (a spare, seconds)
    in fresh namespaces when `namespaces` is True; `setup` then hands it one workspace and confines it there.
    """

    def __init__(self, device: str, cfg: SandboxConfig, namespaces: bool, zygote: Zygote | None = None):
        self.cfg = cfg
        self.device = device
        self.namespaces = namespaces
        self.exit_code: int | None = None
        self.idle_cpu_s = 0.0  # CPU the candidate's process tree used while it had no request (see request)
        # sandbox.thread_filter: asked for in `setup` (SandboxConfig.thread_filter / thread_filter_cuda); `filtered`
        # once it is on (a death by SIGSYS is then a thread, process or timer the solution started)
        # (one intra-op thread on either backend: with more, torch's own pool starts threads after the import)
        self.thread_filter = (cfg.thread_filter_cuda if device.startswith("cuda") else cfg.thread_filter) \
            and cfg.cpu_threads == 1
        self.filter_mode = ""  # set by `setup`: "before_import", or "after_load" for a load_inline solution
        self.filtered = False
        self._idle_mark: float | None = None
        r1, w1 = os.pipe()
        r2, w2 = os.pipe()
        self.log = tempfile.TemporaryFile()
        self.proc: subprocess.Popen | None = None
        # the input segment (sandbox.shm): handed over now, sized and sealed by run_job before `setup`
        shm_fd = shm_mod.create_fd() if cfg.shared_inputs else None
        self.shm = shm_mod.InputSegment(shm_fd) if shm_fd is not None else None
        pid = zygote.spawn(r1, w2, self.log.fileno(), shm_fd) if zygote is not None else None
        if pid is not None:
            self.pid = pid
        else:
            argv = [sys.executable, "-m", "sandbox.candidate", "--fd-in", str(r1), "--fd-out", str(w2),
                    "--device", device, "--threads", str(cfg.cpu_threads)]
            if shm_fd is not None:
                argv += ["--fd-shm", str(shm_fd)]
            if namespaces:
                argv = command_prefix() + argv
            rl = None if namespaces else _rlimits(cfg, device)

            def preexec() -> None:
                _pdeathsig()
                if rl:
                    set_rlimits(rl)

            self.proc = subprocess.Popen(argv, pass_fds=(r1, w2) + ((shm_fd,) if shm_fd is not None else ()),
                                         stdin=subprocess.DEVNULL, stdout=self.log,
                                         stderr=subprocess.STDOUT, cwd="/", env=_worker_env(cfg),
                                         start_new_session=True, preexec_fn=preexec)
            self.pid = self.proc.pid
        os.close(r1)
        os.close(w2)
        self.fd_out, self.fd_in = w1, r2
        os.set_blocking(self.fd_out, False)

    def alive(self) -> bool:
        if self.proc is not None:
            return self.proc.poll() is None
        try:
            os.kill(self.pid, 0)
            return True
        except ProcessLookupError:
            return False

    @property
    def returncode(self) -> int | None:
        if self.exit_code is not None:
            return self.exit_code
        return self.proc.returncode if self.proc is not None else None

    def setup(self, ws: str, io: str, fmt: str, jail: JailSpec | None, env: dict[str, str], timeout_s: float,
              meanwhile: Any = None) -> dict:
        """Hand the worker its workspace (and confinement). Raises wire.ChannelTimeout or CandidateDied.
        meanwhile: trusted work run while the worker sets up (it does not count against timeout_s)."""
        rl = {} if jail is not None else _rlimits(self.cfg, self.device)
        if self.thread_filter:  # a load_inline solution builds in its load (threads, processes): the filter after it
            built = fmt != "extension" or _has_extension_module(env.get("CUDA_AGENT_KERNELS_MANIFEST"))
            self.filter_mode = "before_import" if built else "after_load"
        return self.request({"op": "setup", "workspace": ws, "io": io, "format": fmt,
                             "jail": jail.to_json() if jail else "",
                             "env": env, "rlimits": rl, "flush_bytes": self.cfg.l2_flush_bytes,
                             "gate": gate_setup(self.cfg, self.device, fmt),
                             "monitor": self.cfg.runtime_monitor, "thread_filter": self.filter_mode,
                             "shm_bytes": self.shm.nbytes if self.shm is not None else 0}, timeout_s, meanwhile,
                            deadline_after_meanwhile=True)

    def size_inputs(self, nbytes: int) -> None:
        """Size and seal the input segment (before `setup`); without one, or when that fails, inputs use the wire."""
        if self.shm is None:
            return
        try:
            self.shm.size(nbytes)
        except (OSError, ValueError):
            self.shm.close()
            self.shm = None

    def encode_inputs(self, v: Any, io: str) -> Any:
        """The record of an input value for the next request: in the segment when it fits, else sandbox.wire."""
        if self.shm is not None and self.shm.nbytes:
            rec = self.shm.encode(v)
            if rec is not None:
                return rec
        return wire.encode_value(v, io)

    def log_tail(self, n: int = 2000) -> str:
        try:
            self.log.seek(0, os.SEEK_END)
            size = self.log.tell()
            self.log.seek(max(0, size - n))
            return self.log.read().decode(errors="replace")
        except (OSError, ValueError):
            return ""

    def _died(self) -> "CandidateDied":
        if self.proc is not None:
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        return CandidateDied(self.returncode, self.log_tail())

    def request(self, msg: dict, timeout_s: float, meanwhile: Any = None,
                deadline_after_meanwhile: bool = False) -> dict:
        """Send msg, wait for the reply. Raises wire.ChannelTimeout or CandidateDied. meanwhile: a function this
        side runs between sending and waiting (work that overlaps the candidate's); its time counts against
        timeout_s unless deadline_after_meanwhile."""
        deadline = time.monotonic() + timeout_s
        nonce = secrets.token_hex(16)
        self._check_idle(str(msg.get("op")))
        msg = {**msg, "nonce": nonce}
        try:
            wire.send(self.fd_out, msg, timeout_s=timeout_s)
            if meanwhile is not None:
                meanwhile()
                if deadline_after_meanwhile:
                    deadline = time.monotonic() + timeout_s
            reply = wire.recv(self.fd_in, timeout_s=max(0.01, deadline - time.monotonic()),
                              max_bytes=self.cfg.max_message_bytes)
        except (wire.ChannelClosed, wire.MessageTooLarge, ValueError):
            raise self._died() from None
        if not isinstance(reply, dict):
            raise self._died()
        if "__exit__" in reply and len(reply) == 1:  # written by the zygote's intermediate when the worker died
            self.exit_code = int(reply["__exit__"]) if isinstance(reply["__exit__"], int) else None
            raise self._died()
        if self.cfg.idle_cpu_limit_s > 0:
            self._idle_mark = tree_cpu_s(self.pid)
        if reply.get("nonce") != nonce:
            raise StageFailure(Status.FORBIDDEN, f"{msg.get('op')}: a reply that does not answer the request arrived "
                                                 "(written by the solution, not the harness)",
                               [Violation("forged_reply", f"reply to {msg.get('op')!r} without the request's nonce")])
        return reply

    def _check_idle(self, op: str) -> None:
        """Before a request: add what the candidate's process tree used since the last reply (it had nothing to
        do: the harness blocks on its request pipe) and refuse past SandboxConfig.idle_cpu_limit_s."""
        if self._idle_mark is None or self.cfg.idle_cpu_limit_s <= 0:
            return
        now = tree_cpu_s(self.pid)
        if now is None:
            return
        self.idle_cpu_s += max(0.0, now - self._idle_mark)
        self._idle_mark = now
        if self.idle_cpu_s > self.cfg.idle_cpu_limit_s:
            detail = (f"the candidate's process used {self.idle_cpu_s * 1e3:.0f} ms of CPU while it had no request to "
                      f"answer (limit {self.cfg.idle_cpu_limit_s * 1e3:.0f} ms; work outside its calls, e.g. a thread "
                      "of its own running while the baselines are timed)")
            raise StageFailure(Status.FORBIDDEN, f"{op}: {detail}", [Violation("background_work", detail)])

    def kill(self, keep_reply_pipe: bool = False) -> int | None:
        """SIGKILL the whole tree and close this side's ends. keep_reply_pipe: leave the reply pipe's read end open
        and return it, for `wait_for_eof` (the tree is gone once every process holding the write end has exited:
        a zygote-forked candidate is no child of ours, so it cannot be waited for); else return None."""
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if self.proc is not None:
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        for fd in (self.fd_out,) if keep_reply_pipe else (self.fd_out, self.fd_in):
            try:
                os.close(fd)
            except OSError:
                pass
        if self.shm is not None:
            self.shm.close()
            self.shm = None
        self.log.close()
        return self.fd_in if keep_reply_pipe else None


def wait_for_eof(fds: list[int], timeout_s: float) -> list[int]:
    """Read and drop what arrives on each pipe read end in fds until its EOF (every writer has exited) or until
    timeout_s (seconds) has passed; close those that reached EOF. Returns the fds still open (their writers alive)."""
    import select

    end = time.monotonic() + timeout_s
    open_fds = list(fds)
    poller = select.poll()  # not select.select: a busy node's fds can be past FD_SETSIZE (1024)
    for fd in open_fds:
        os.set_blocking(fd, False)
        poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    while open_fds:
        events = poller.poll(max(0.0, end - time.monotonic()) * 1e3)
        if not events:
            break
        for fd, _ in events:
            if fd not in open_fds:
                continue
            try:
                chunk = os.read(fd, 1 << 16)
            except BlockingIOError:
                continue
            except OSError:
                chunk = b""
            if not chunk:
                poller.unregister(fd)
                os.close(fd)
                open_fds.remove(fd)
    return open_fds


class CandidateDied(Exception):
    def __init__(self, returncode: int | None, log_tail: str):
        super().__init__(f"candidate worker exited ({returncode})")
        self.returncode = returncode
        self.log_tail = log_tail


class WorkerPool:
    """Where candidate workers come from: forked from a zygote per (device, namespaces) when it works (ms),
    else one spare started ahead per (device, namespaces), so an evaluation rarely waits for torch's import."""

    def __init__(self, cfg: SandboxConfig, use_zygote: bool = True):
        self.cfg = cfg
        self.use_zygote = use_zygote
        self.zygotes: dict[tuple[str, bool], Zygote] = {}
        self.spares: dict[tuple[str, bool], CandidateProcess] = {}
        self.dying: list[int] = []  # reply pipes of retired candidates whose trees may still be tearing down

    def retire(self, cand: CandidateProcess) -> None:
        """Kill a used candidate's tree without waiting for it (off the reply's path); `await_teardown` waits."""
        self.dying = wait_for_eof(self.dying, 0.0)  # those gone since (evaluations without a profile never wait)
        while len(self.dying) >= DYING_MAX:  # trees that keep their pipe open for good: no longer waited for
            os.close(self.dying.pop(0))
        fd = cand.kill(keep_reply_pipe=True)
        if fd is not None:
            self.dying.append(fd)

    def await_teardown(self, timeout_s: float = TEARDOWN_WAIT_S) -> tuple[float, int]:
        """Wait until the retired candidates' trees are gone (their memory released), up to timeout_s seconds:
        before anything is timed, so no measurement runs beside a teardown. Returns (ms waited, trees still alive at
        the deadline: their pipes are closed and they are no longer waited for)."""
        if not self.dying:
            return 0.0, 0
        t0 = time.perf_counter()
        left = wait_for_eof(self.dying, timeout_s)
        for fd in left:
            os.close(fd)
        self.dying = []
        return (time.perf_counter() - t0) * 1e3, len(left)

    def take(self, device: str, namespaces: bool) -> CandidateProcess:
        key = (device, namespaces)
        if self.use_zygote:
            z = self.zygotes.get(key)
            if z is None:
                z = self.zygotes[key] = Zygote(device, self.cfg, namespaces)
            if not z.broken:
                return CandidateProcess(device, self.cfg, namespaces, z)  # a slow start if the zygote failed
        p = self.spares.pop(key, None)
        if p is None or not p.alive():
            if p is not None:
                p.kill()
            p = CandidateProcess(device, self.cfg, namespaces)
        self.spares[key] = CandidateProcess(device, self.cfg, namespaces)
        return p

    def close(self) -> None:
        for p in self.spares.values():
            p.kill()
        for z in self.zygotes.values():
            z.close()
        for fd in self.dying:
            os.close(fd)
        self.dying = []
        self.spares.clear()
        self.zygotes.clear()


def _rlimits(cfg: SandboxConfig, device: str) -> dict[str, int]:
    rl = {"cpu_s": cfg.rlimit_cpu_s, "fsize_bytes": cfg.rlimit_fsize_bytes, "nofile": cfg.rlimit_nofile}
    if cfg.sandbox_uid > 0:
        rl["nproc"] = cfg.rlimit_nproc
    if cfg.rlimit_as_bytes and not device.startswith("cuda"):
        rl["as_bytes"] = cfg.rlimit_as_bytes
    return rl


def candidate_jail(ws: str, model_py: str, cfg: SandboxConfig, device: str, writable: list[str],
                   uid: int) -> JailSpec:
    # the trusted side's folders are hidden and the workspace's reference copy concealed (sandbox.jail): native
    # code of the solution, which the in-process monitor cannot see, opens none of them
    private = trusted_roots(cfg.cache_dir, str(cfg.workspaces_dir))
    return JailSpec(workspace=ws, readonly=[], writable=writable, uid=uid,
                    expose=candidate_expose() + toolkit_dirs(), rlimits=_rlimits(cfg, device),
                    hide=list(DEFAULT_HIDE) + private, conceal=[model_py])


def _signal_number_name(n: int) -> str:
    try:
        return signal.Signals(n).name
    except ValueError:
        return f"signal {n}"


def _signal_name(rc: int | None) -> str:
    if rc is None:
        return "still running"
    if rc < 0:
        try:
            return f"killed by signal {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    if rc > 128:
        try:
            return f"killed by signal {signal.Signals(rc - 128).name}"
        except ValueError:
            pass
    return f"exit code {rc}"


def _headline(tb: str) -> str:
    """The line of a traceback a person should read first: a CUDA error line when there is one (torch appends
    advice lines after it), else the exception line (last non-empty line)."""
    lines = [ln.strip() for ln in tb.splitlines() if ln.strip()]
    for ln in lines:
        if "CUDA error" in ln or "CUDA_ERROR" in ln:
            return ln
    return lines[-1] if lines else ""


VIOLATION_KINDS = {"import", "introspection", "tampering", "dynamic_code", "ctypes", "memory_read", "memory_write",
                   "hook", "fallback", "reference_access", "process", "network", "thread", "monkeypatch", "timer_tampering", "lazy_output",
                   "stale_output", "write_after_return", "file_write", "file_access", "guard_bypass", "numpy_bridge",
                   "harness_tampering", "global_state"}


def _violation(v: str) -> Violation:
    """A violation string from the candidate worker -> Violation (its "kind: detail" prefix, else by content)."""
    head, _, rest = v.partition(": ")
    if head in VIOLATION_KINDS and rest:
        return Violation(head, rest)
    if "imports" in v or "reaches __import__" in v:
        return Violation("import", v)
    return Violation("dispatch_op", v)


def _reply_failure(reply: dict, stage: str) -> StageFailure:
    status = reply.get("status", "runtime_error")
    try:
        st = Status(status)
    except ValueError:
        st = Status.RUNTIME_ERROR
    viol = [_violation(v) for v in reply.get("violations", [])]
    err = (reply.get("error") or "").strip()
    last = _headline(err) if err else (viol[0].detail if viol else "")
    msg = f"{stage}: {last}" if last else stage
    f = StageFailure(st, msg, viol)
    f.detail = err  # type: ignore[attr-defined]
    return f


def _nvml(device_index: int) -> dict[str, Any] | None:
    """Clocks (MHz), temperature (C), utilisation (%) and power (W) of a GPU now: NVML, else nvidia-smi; None if
    neither answers (readings are best effort)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(device_index)
        return {
            "t": time.time(),
            "sm_clock_mhz": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
            "mem_clock_mhz": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM),
            "temperature_c": pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU),
            "utilization_pct": pynvml.nvmlDeviceGetUtilizationRates(h).gpu,
            "power_w": pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0,
            "source": "nvml",
        }
    except Exception:  # noqa: BLE001
        pass
    try:
        q = "clocks.sm,clocks.mem,temperature.gpu,utilization.gpu,power.draw"
        p = subprocess.run(["nvidia-smi", f"--id={device_index}", f"--query-gpu={q}", "--format=csv,noheader,nounits"],
                           capture_output=True, text=True, timeout=10)
        vals = [v.strip() for v in p.stdout.strip().split(",")]
        num = [float(v) if v.replace(".", "", 1).isdigit() else -1.0 for v in vals]
        return {"t": time.time(), "sm_clock_mhz": num[0], "mem_clock_mhz": num[1], "temperature_c": num[2],
                "utilization_pct": num[3], "power_w": num[4], "source": "nvidia-smi"}
    except (OSError, subprocess.TimeoutExpired, IndexError, ValueError):
        return None


# ----------------------------------------------------------------------------------------------------- inputs ahead
class Prefetch:
    """Input sets (and the variant trials' reference outputs) made ahead by one background thread of the trusted
    worker, while the candidate starts, loads and is verified and in the untimed parts of the profile, so that
    making fresh inputs for every timed call costs little evaluation wall time.

    What keeps it honest: the thread only runs trusted code (the task's get_inputs() from fresh secret seeds, the
    reference model); nothing it makes reaches the candidate before the request that needs it; and every timed
    region (eager's, torch.compile's, the candidate's) runs inside `quiet()`, which returns only once the thread
    sits idle at its gate (a job never starts while quiet; one in progress is waited for, and on a GPU the device
    work it queued too), so no background work ever overlaps a timed region. Work not made ahead (past
    `prefetch_input_bytes_max`) is made in the main thread, per repetition, as before.
    """

    def __init__(self, cuda: bool, device: str):
        self.cuda = cuda
        self.device = device
        self._pool: ThreadPoolExecutor | None = ThreadPoolExecutor(1, thread_name_prefix="sandbox-inputs")
        self._cv = threading.Condition()
        self._paused = False
        self._busy = False

    def submit(self, fn: Any, *args: Any) -> Future:
        if self._pool is None:
            raise RuntimeError("Prefetch.submit after cancel")
        return self._pool.submit(self._gated, fn, *args)

    def _gated(self, fn: Any, *args: Any) -> Any:
        with self._cv:
            while self._paused:
                self._cv.wait()
            self._busy = True
        try:
            return fn(*args)
        finally:
            with self._cv:
                self._busy = False
                self._cv.notify_all()

    def quiet(self) -> "_Quiet":
        """Context manager: the thread is idle (and its device work done) inside, and resumes after."""
        return _Quiet(self)

    def pause(self) -> None:
        with self._cv:
            self._paused = True
            while self._busy:
                self._cv.wait()
        if self.cuda:
            torch.cuda.synchronize(self.device)  # device work the thread queued (scrubs, transfers) ends here too

    def resume(self) -> None:
        with self._cv:
            self._paused = False
            self._cv.notify_all()

    def cancel(self) -> None:
        """Drop what has not started, let the job in progress finish, stop the thread (an evaluation's end)."""
        if self._pool is None:
            return
        pool, self._pool = self._pool, None
        pool.shutdown(wait=False, cancel_futures=True)
        self.resume()  # a job held at the gate goes on (and ends); the thread then exits
        pool.shutdown(wait=True)


class _Quiet:
    def __init__(self, pf: Prefetch):
        self.pf = pf

    def __enter__(self) -> None:
        self.pf.pause()

    def __exit__(self, *exc: Any) -> None:
        self.pf.resume()


def _value_variant_job(state: TaskState) -> tuple[float, list | None, Any, str]:
    """(scale, inputs, reference outputs, skip reason) of the value-range trial (see _verify_value_variant)."""
    rng = secrets.SystemRandom()
    scale = 2.0 + 2.0 * rng.random()
    x = [t * scale if isinstance(t, torch.Tensor) and t.is_floating_point() else t
         for t in state.make_inputs(secrets.randbits(62))]
    try:
        ref = state.reference_outputs(state.to_device(x))
    except Exception as e:  # noqa: BLE001
        return scale, None, None, f"value-range trial skipped: the reference fails on scaled inputs ({type(e).__name__})"
    refs = [ref] if isinstance(ref, torch.Tensor) else [r for r in ref if isinstance(r, torch.Tensor)]
    if any(r.is_floating_point() and not bool(torch.isfinite(r).all()) for r in refs):
        return scale, None, None, "value-range trial skipped: the reference is not finite on scaled inputs"
    return scale, x, ref, ""


def _shape_variant_job(job: dict, cache: "collections.OrderedDict[tuple, TaskState]", device: str, ov: dict,
                       trials: int) -> tuple[TaskState | None, list, list, str]:
    """(variant TaskState, inputs, reference outputs, skip reason) of one shape variant's trials."""
    key = (job["reference_hash"], device, tuple(sorted(ov.items())))
    try:
        vs = cache.get(key)
        if vs is None:
            vs = TaskState(job["reference"], job["task_id"], device, ov)
            cache[key] = vs
        xs = [vs.make_inputs(secrets.randbits(62)) for _ in range(trials)]
        refs = [vs.reference_outputs(vs.to_device(x)) for x in xs]
    except Exception as e:  # noqa: BLE001 - the reference does not support these shapes: not the candidate's fault
        return None, [], [], (f"shape variant {ov} skipped: the reference fails there "
                              f"({type(e).__name__}: {str(e)[:120]})")
    return vs, xs, refs, ""


def _make_sets(state: TaskState, n: int) -> list:
    return [state.make_inputs(secrets.randbits(62)) for _ in range(n)]


class ProfilePlan:
    """What the profile stage will need, estimated in the reference stage: calls per repetition (from eager's time
    per call) and the fresh input sets made ahead for that many calls (futures, or None for sets made per
    repetition). The profile decides its calls per repetition itself, as before (one eager call after the
    baselines' warm-up); the estimate only sizes what is made ahead (the warm-up's sets too: warmup_sets) and the
    input segment."""

    def __init__(self, state: TaskState, cfg: SandboxConfig, cuda: bool, device: str, xs_dev: list[list],
                 fmt: str = "cubin"):
        self.flush = l2_flush_buffer(cfg.l2_flush_bytes, device) if cuda else None
        timer = trusted_timer(cfg, cuda, device, self.flush, fmt)  # gated as the profile will be (format)

        def eager(a: list) -> Any:
            with torch.no_grad():
                out = state.model(*a)
            scrub_device(out)
            return out

        # eager's time per call: the median of single calls on up to 3 of the trials' sets
        times = sorted(timer.run(eager, [x], label="eager")["ms_per_call"] for x in xs_dev[:3])
        self.in_bytes = sum(t.numel() * t.element_size() for t in _tensor_list(xs_dev[0])) or 1
        self.calls = calls_per_rep(cfg, times[len(times) // 2], self.in_bytes)
        self.warmup: list[Future] = []
        self.reps: list[list[Future]] = [[] for _ in range(cfg.reps)]

    def segment_bytes(self, cfg: SandboxConfig, x_cpu: list) -> int:
        """Bytes of the input segment: one repetition's sets (or the warm-up's, or one verification set), with
        room for twice the estimated calls (a repetition that needs more goes through the wire)."""
        per_set = shm_mod.tensor_bytes(x_cpu)
        return per_set * max(1, min(2 * self.calls, cfg.fresh_calls_per_rep_max), cfg.warmup_calls)

    def prefetch(self, pf: Prefetch, state: TaskState, cfg: SandboxConfig) -> None:
        """Queue the warm-up's and the repetitions' sets, one job per set (a pause waits for one set at most)."""
        budget = cfg.prefetch_input_bytes_max
        for slot, n in ([(self.warmup, warmup_sets(cfg, self.calls))]
                        + [(self.reps[r], self.calls) for r in range(cfg.reps)]):
            for _ in range(n):
                if budget < self.in_bytes:
                    return
                slot.append(pf.submit(state.make_inputs, secrets.randbits(62)))
                budget -= self.in_bytes


def warmup_sets(cfg: SandboxConfig, calls: int) -> int:
    """Input sets of the profile's warm-up request (each implementation's untimed calls before the first
    repetition): cfg.warmup_calls, raised to a repetition's `calls` (0 when warmup_calls is 0: no warm-up)."""
    return max(cfg.warmup_calls, calls) if cfg.warmup_calls else 0


def calls_per_rep(cfg: SandboxConfig, one_ms: float, in_bytes: int) -> int:
    """Timed calls per repetition: enough that one repetition of eager lasts min_rep_ms, within the caps."""
    return max(1, min(cfg.max_calls_per_rep, cfg.fresh_calls_per_rep_max, math.ceil(cfg.min_rep_ms / max(one_ms, 1e-6)),
                      max(1, cfg.timed_input_bytes_max // max(in_bytes, 1))))


# ----------------------------------------------------------------------------------------------------- one job
def _compare_threads(cfg: SandboxConfig, cuda: bool) -> int:
    """torch threads for comparing outputs: on a GPU host SandboxConfig.verify_threads (0: the cores this process
    may run on); on the CPU backend cpu_threads (the baselines' footing)."""
    if not cuda:
        return cfg.cpu_threads
    return cfg.verify_threads or max(1, len(os.sched_getaffinity(0)))


@contextlib.contextmanager
def _threads(n: int) -> Iterator[None]:
    """torch's intra-op thread count set to n for the block, then put back."""
    prev = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(prev)


class _JobLock:
    """The device's timing lock over one job (job["timing_lock"]: key, dir, timeout_s; absent: no lock, nothing
    is held): shared around the job's untimed GPU work (the reference stage, verification: let go between two
    trials while a timer waits), exclusive around its timed sections (calibration, profile), so that a sampler or
    another worker on the GPU runs beside everything but the timing. `record` writes the waits and the exclusive
    hold (ms) and `contended` (a timed section that could not have the lock within timeout_s ran anyway) into the
    job's out."""

    def __init__(self, spec: dict | None):
        self.lock = DeviceTimingLock(spec["key"], spec["dir"]) if spec else None
        self.timeout_s = float(spec["timeout_s"]) if spec else 0.0
        self.timed_wait_ms = 0.0
        self.timed_held_ms = 0.0
        self.acquired = True
        self.shared: list[SharedUse] = []

    def untimed(self) -> SharedUse:
        # no timeout: untimed work never runs without the lock (a timer that got it then would time beside it
        # unflagged); a shared wait ends with the timer's section, itself bounded by the timer's own time limits
        use = SharedUse(self.lock, None)
        self.shared.append(use)
        return use

    @contextlib.contextmanager
    def timed(self) -> Iterator[None]:
        if self.lock is None:
            yield
            return
        with self.lock.timing(self.timeout_s) as state:
            self.timed_wait_ms += state.wait_ms
            self.acquired = self.acquired and state.acquired
            t = time.perf_counter()
            try:
                yield
            finally:
                self.timed_held_ms += (time.perf_counter() - t) * 1e3

    def record(self, out: dict) -> None:
        if self.lock is None:
            return
        out["stage_ms"]["timing_lock_wait"] = self.timed_wait_ms
        out["stage_ms"]["timing_lock_held"] = self.timed_held_ms
        out["stage_ms"]["timing_lock_shared_wait"] = sum(u.wait_s for u in self.shared) * 1e3
        if not self.acquired:
            out["contended"] = True
            out["log"].append(f"timing lock {self.lock.key} not had within {self.timeout_s:g} s: other work may have "
                              "shared the device while this was timed; re-measure before trusting the reward")


def run_job(job: dict, cache: "collections.OrderedDict[tuple, TaskState]", cfg: SandboxConfig,
            spares: "WorkerPool") -> dict:
    """Evaluate one built solution. job: task_id, reference, shape_overrides, atol, rtol, workspace, model_py,
    manifest, format, device, jail_uid (None: no namespaces), writable, extra_env, load_timeout_s, and optionally
    timing_lock ({key, dir, timeout_s}: the device's lock, see _JobLock).
    Returns a plain dict: status, message, trials, timing, violations, log, stage_ms, nvml (and contended: True
    when a timed section ran without the lock)."""
    out: dict[str, Any] = {"trials": [], "timing": None, "violations": [], "log": [], "stage_ms": {}, "nvml": []}
    device = job["device"]
    cuda = device.startswith("cuda")
    # On a GPU the comparisons of a GPU-sized task's outputs (2 GiB on the CPU copies) get verify_threads until the
    # profile starts, and around each profile check (_check_timed); eager and torch.compile are timed with
    # cpu_threads, as on the CPU backend (the baselines' footing).
    torch.set_num_threads(_compare_threads(cfg, cuda))
    t0 = time.perf_counter()
    key = (job["reference_hash"], device, tuple(sorted((job.get("shape_overrides") or {}).items())))
    state = cache.get(key)

    def reference_failed(e: BaseException, tb: str) -> dict:
        out.update(status=Status.INTERNAL_ERROR.value, message=f"reference failed: {type(e).__name__}: {e}",
                   detail=tb[-2000:])
        if cuda:
            out["device_free_fraction"] = _device_free_fraction()
        return out

    try:
        if state is None:
            state = TaskState(job["reference"], job["task_id"], device, job.get("shape_overrides"))
            cache[key] = state
            while len(cache) > _MAX_TASKS:
                cache.popitem(last=False)
        cache.move_to_end(key)
    except Exception as e:  # noqa: BLE001 - a broken reference is the sandbox's problem, not the candidate's
        return reference_failed(e, traceback.format_exc())
    ref: dict[str, Any] = {}
    gpu = _JobLock(job.get("timing_lock"))
    span = contextlib.ExitStack()  # the lock held shared from the candidate's load to the end of verification

    def reference_stage() -> None:
        """Trial inputs from fresh secret seeds, their reference outputs, the profile's estimate (trusted work)."""
        tr = time.perf_counter()
        try:
            with gpu.untimed():
                seeds = [secrets.randbits(62) for _ in range(cfg.num_trials)]
                ref["inputs_cpu"] = [state.make_inputs(s) for s in seeds]
                # the reference outputs first (on copies): they tell whether the reference writes its inputs, and so
                # whether the device sets the baselines use must be private copies on the CPU backend too (to_device)
                ref["ref_outs"] = [state.reference_outputs(state.to_device(x)) for x in ref["inputs_cpu"]]
                # private device copies for the baselines: eager's estimate times up to 3 of them, the profile
                # keeps the first (a copy of every trial's set held 8 GiB more on a task with 2 GiB inputs)
                xs_dev = [state.to_device(x) for x in ref["inputs_cpu"][:3]] if cfg.profile else []
                ref["plan"] = (ProfilePlan(state, cfg, cuda, device, xs_dev, job["format"]) if cfg.profile
                               else None)
                ref["inputs_dev"] = xs_dev[:1]
                del xs_dev
        except Exception as e:  # noqa: BLE001
            ref["error"] = (e, traceback.format_exc())
        out["stage_ms"]["reference"] = (time.perf_counter() - tr) * 1e3

    jail = None
    if job.get("jail_uid") is not None:
        jail = candidate_jail(job["workspace"], job["model_py"], cfg, device, job.get("writable", []), job["jail_uid"])
    cand: CandidateProcess | None = None
    in_profile = read_free = False
    pf: Prefetch | None = None
    spill: wire.SpillDir | None = None
    # the build's manifest is read now, before any candidate code exists (the workspace is the candidate's)
    evidence = Evidence(job.get("manifest"), job["format"])
    try:
        t1 = time.perf_counter()
        cand = spares.take(device, jail is not None)
        # The candidate's start (confinement, its harness; no solution code yet) overlaps the reference stage when
        # the task's segment size is known from an earlier evaluation (the segment is sealed before `setup`).
        overlap = state.segment_bytes > 0
        if overlap:
            cand.size_inputs(state.segment_bytes)
        else:
            reference_stage()
            if "error" in ref:
                return reference_failed(*ref["error"])
            cand.size_inputs(ref["plan"].segment_bytes(cfg, ref["inputs_cpu"][0]) if ref["plan"] is not None
                             else shm_mod.tensor_bytes(ref["inputs_cpu"][0]))
        ws = job["workspace"]
        # large tensors travel as files in the spill folder (sandbox.workspace: beside the workspace), reached only
        # through this directory fd, opened before any candidate code exists (sandbox.wire.SpillDir)
        io_path = job.get("io_dir") or os.path.join(ws, ".io")
        io = spill = wire.SpillDir.open(io_path, owner=job["jail_uid"] if (job.get("jail_uid") or 0) > 0
                                        else os.geteuid())
        env = {"HOME": ws, "TMPDIR": os.path.join(ws, ".tmp"), **(job.get("extra_env") or {})}
        if job.get("manifest"):
            env["CUDA_AGENT_KERNELS_MANIFEST"] = job["manifest"]
        try:
            # The spare may still be importing torch: that wait is trusted work, not the candidate's load time.
            try:
                reply = cand.setup(ws, io_path, job["format"], jail, env, SPARE_START_TIMEOUT_S,
                                   reference_stage if overlap else None)
            except (wire.ChannelTimeout, CandidateDied) as e:
                raise StageFailure(Status.INTERNAL_ERROR, f"candidate worker did not start: {e}") from None
            if "error" in ref:
                return reference_failed(*ref["error"])
            if not reply.get("ok"):
                raise StageFailure(Status.INTERNAL_ERROR, f"candidate setup: {reply.get('error', '?')}")
            out["stage_ms"]["candidate_start"] = (time.perf_counter() - t1) * 1e3
            if cfg.profile:  # before load: nothing but the harness answers yet
                # the previous evaluation's candidate: gone before anything is timed (usually long since, during
                # this job's reference stage and candidate start)
                waited_ms, alive = spares.await_teardown()
                if waited_ms >= 1.0 or alive:
                    out["stage_ms"]["previous_teardown"] = waited_ms
                if alive:
                    out["log"].append(f"profile: {alive} earlier candidate tree(s) still exiting after "
                                      f"{waited_ms:.0f} ms; timed beside their teardown")
                # requests of up to calibration_calls_max calls (its docstring has the trade-off of cost and noise)
                n_cal = min(ref["plan"].calls, cfg.calibration_calls_max) if ref["plan"] is not None else 1
                # what the costs depend on besides the task: calls per request, the format, the timing gate
                # (the extension format is timed ungated by default), the confinement
                cal_key = (n_cal, job["format"], gate_setup(cfg, device, job["format"]) is not None,
                           jail is not None)
                prev = state.calibration
                reuse = prev[1:3] if prev is not None and prev[0] == cal_key and prev[3] > 0 else None
                with gpu.timed():
                    tc = time.perf_counter()  # the lock's wait is timing_lock_wait, not calibration
                    calib = _calibrate(cand, ref["inputs_cpu"][0], ref["ref_outs"][0], n_cal, io,
                                       log=out["log"], reuse=reuse)
                    cal_ms = (time.perf_counter() - tc) * 1e3
                state.calibration = _kept_calibration(prev, cal_key, calib, cal_ms, reuse is not None,
                                                      gpu.acquired, cfg)
                if reuse is not None:
                    out["log"].append(f"profile: harness costs reused from an earlier evaluation's calibration of this "
                                      f"task ({prev[3] - 1} more use(s) before it is measured again)")
                out["stage_ms"]["calibration"] = cal_ms
            inputs_cpu, inputs_dev, ref_outs, plan = ref["inputs_cpu"], ref["inputs_dev"], ref["ref_outs"], ref["plan"]
            needed = plan.segment_bytes(cfg, inputs_cpu[0]) if plan is not None else shm_mod.tensor_bytes(inputs_cpu[0])
            state.segment_bytes = max(state.segment_bytes, needed)
            # What the rest of the evaluation needs, made in the background from here on (Prefetch: never while
            # anything is timed).
            share = span.enter_context(gpu.untimed())  # load and verify: the candidate runs on the GPU
            pf = Prefetch(cuda, device)
            value_job = pf.submit(_value_variant_job, state) if cfg.value_variant else None
            shape_jobs = [(ov, pf.submit(_shape_variant_job, job, cache, device, ov, cfg.shape_variant_trials))
                          for ov in job.get("shape_variants") or []]
            if plan is not None:
                plan.prefetch(pf, state, cfg)
            t1 = time.perf_counter()
            threads0 = thread_filter.thread_ids(cand.pid)
            filters0 = thread_filter.seccomp_filters(cand.pid)
            signals0 = thread_filter.caught_signals(cand.pid)
            cand.filtered = cand.filter_mode == "before_import"  # installed as the request arrives
            reply = cand.request({"op": "load", "init_inputs": wire.encode_value(state.init_inputs, io),
                                  "state_dict": wire.encode_value(state.state_dict, io)}, job["load_timeout_s"])
        except wire.ChannelTimeout:
            raise StageFailure(Status.TIMEOUT, f"load: model_new.py import / ModelNew construction ran past "
                                               f"{job['load_timeout_s']:g} s") from None
        except CandidateDied as e:
            _raise_if_thread_started(cand, e, "load")
            tail = e.log_tail.strip().splitlines()
            if e.returncode == 125:
                raise StageFailure(Status.INTERNAL_ERROR, f"confinement failed: {' '.join(tail[-1:])}") from None
            raise StageFailure(Status.LOAD_ERROR, f"load: the candidate worker died ({_signal_name(e.returncode)})"
                               + (f": {tail[-1]}" if tail else "")) from None
        if not reply.get("ok"):
            raise _reply_failure(reply, "load")
        out["log"].extend(reply.get("log", []))
        _after_load_threads(cand, reply, threads0, filters0, signals0, out["log"])
        out["stage_ms"]["load"] = (time.perf_counter() - t1) * 1e3
        # ---------------------------------------------------------------- verify
        t2 = time.perf_counter()
        atol, rtol = job["atol"], job["rtol"]
        fmt = job["format"]
        prec = _precision_budget(cfg)
        def check(i: int, reply: dict, ref: Any) -> None:
            tr = _check_reply(reply, ref, atol, rtol, i, io, prec)
            out["trials"].append(tr.to_dict())
            if not tr.ok:
                raise StageFailure(Status.INCORRECT, f"trial {i}: {tr.message}", _trial_violations(tr))

        # trial i's outputs are compared while the candidate runs trial i + 1 (a failure of trial i still ends the
        # evaluation first, with trial i's verdict)
        pending: tuple | None = None

        def let_timer_in() -> None:
            """Inside the shared span, between two trials: while a timer waits, let the lock go with the input
            thread held (its GPU work must not run beside that timing either), and take it again."""
            if share.lock is not None and share.lock.timing_requested():
                pf.pause()
                share.pause()
                pf.resume()

        for i, (x, ref) in enumerate(zip(inputs_cpu, ref_outs)):
            let_timer_in()
            reply = _run(cand, {"op": "run", "inputs": cand.encode_inputs(x, io), "poison": cfg.poison_outputs},
                         cfg.trial_timeout_s, f"trial {i}", (lambda p=pending: check(*p)) if pending else None)
            evidence.add(reply, f"trial {i}")
            pending = (i, reply, ref)
        if pending is not None:
            check(*pending)
        let_timer_in()
        if value_job is not None:
            _verify_value_variant(cand, value_job.result(), cfg, atol, rtol, io, prec, evidence, out)
        let_timer_in()
        if shape_jobs:
            _verify_shape_variants(cand, job, state, shape_jobs, cfg, atol, rtol, io, prec, evidence, out)
        out["log"].extend(evidence.summary())
        out["stage_ms"]["verify"] = (time.perf_counter() - t2) * 1e3
        if not cfg.profile:
            out.update(status=Status.OK.value, message="correct on every trial (profiling off)", reward=0.0)
            return out
        # ---------------------------------------------------------------- profile
        t3 = time.perf_counter()
        torch.set_num_threads(cfg.cpu_threads)
        # the shared span ends before the exclusive section (this process would wait for itself); the input thread
        # is held meanwhile, so none of this job's GPU work runs while the lock is not held
        pf.pause()
        span.close()
        in_profile = True
        with gpu.timed():
            pf.resume()
            timing = _profile(cand, state, plan, pf, inputs_dev[0], cfg, cuda, device, atol, rtol, out, io, fmt,
                              prec, calib)
        out["stage_ms"]["profile"] = (time.perf_counter() - t3) * 1e3
        out["timing"] = timing.to_dict()
        out.update(status=Status.OK.value, reward=float(timing.milestone), message=timing.milestone_reason)
        return out
    except StageFailure as f:
        out.update(status=f.status.value, message=f.message)
        # trusted evidence for the node's out-of-memory re-run (sandbox.service_admission), read in `finally` once
        # the candidate's processes are gone (their own memory must not count); never for the profile (a re-run
        # there would give the candidate a second draw of its timing)
        read_free = cuda and not in_profile and bool(OOM_PATTERN.search(f.message + str(getattr(f, "detail", ""))))
        out["violations"].extend(v.to_dict() for v in f.violations)
        if getattr(f, "detail", ""):
            out["detail"] = f.detail  # type: ignore[attr-defined]
        return out
    finally:
        span.close()
        gpu.record(out)
        if pf is not None:
            pf.cancel()
        if cand is not None:
            try:
                wire.send(cand.fd_out, {"op": "exit"}, timeout_s=0.2)
            except Exception:  # noqa: BLE001
                pass
            spares.retire(cand)  # the next job's first timed section waits for its teardown (await_teardown)
        if spill is not None:
            spill.close()
        if read_free:
            spares.await_teardown()
            out["device_free_fraction"] = _device_free_fraction()


def _device_free_fraction() -> float:
    """Free share of the current device's memory, all processes (cudaMemGetInfo); -1.0 when it cannot be read."""
    try:
        free, total = torch.cuda.mem_get_info()
        return free / total if total else -1.0
    except Exception:  # noqa: BLE001 - best effort: no evidence
        return -1.0


def tree_cpu_s(pid: int, precise: bool = False) -> float | None:
    """CPU seconds (user + system, all threads) of process `pid` and its descendants, those that exited and were
    waited for included, read from /proc (children through /proc/PID/task/TID/children); None when pid's own stat
    cannot be read. Clock-tick resolution; with
    `precise`, each process's CPU clock (clock_gettime on its CLOCK_PROCESS_CPUTIME_ID: nanoseconds, every thread,
    exited ones included) where it can be read, its stat's ticks where not."""
    ticks = 0
    exact = 0.0
    stack, seen = [pid], set()
    while stack:
        p = stack.pop()
        if p in seen:
            continue
        seen.add(p)
        try:
            with open(f"/proc/{p}/stat", "rb") as f:
                stat = f.read()
            fields = stat[stat.rindex(b")") + 2:].split()
            clock = _process_cpu_clock_s(p) if precise else None
            if clock is None:
                ticks += int(fields[11]) + int(fields[12])  # utime, stime (stat fields 14 and 15)
            else:
                exact += clock
            # cutime, cstime (16 and 17): children that exited and were waited for, which the walk no longer finds
            # (a per-call child that does work and is reaped before the next read)
            ticks += int(fields[13]) + int(fields[14])
            for t in os.listdir(f"/proc/{p}/task"):
                try:
                    with open(f"/proc/{p}/task/{t}/children", "rb") as f:
                        stack.extend(int(c) for c in f.read().split())
                except OSError:
                    pass
        except (OSError, ValueError, IndexError):
            if p == pid:
                return None
    return ticks / _CLK_TCK + exact


def _process_cpu_clock_s(pid: int) -> float | None:
    """Process pid's CPU clock (seconds, all its threads; Linux's MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED), what
    clock_getcpuclockid(3) returns), or None where it cannot be read."""
    try:
        return time.clock_gettime(((~pid) << 3) | 2)
    except (OSError, OverflowError):
        return None


_CLK_TCK = float(os.sysconf("SC_CLK_TCK"))


def _run(cand: CandidateProcess, msg: dict, timeout_s: float, stage: str, meanwhile: Any = None) -> dict:
    try:
        reply = cand.request(msg, timeout_s, meanwhile)
    except wire.ChannelTimeout:
        raise StageFailure(Status.TIMEOUT, f"{stage}: forward ran past {timeout_s:g} s (process tree killed)") from None
    except CandidateDied as e:
        _raise_if_thread_started(cand, e, stage)
        tail = [ln for ln in e.log_tail.strip().splitlines() if ln.strip()]
        raise StageFailure(Status.RUNTIME_ERROR, f"{stage}: the candidate worker crashed "
                                                 f"({_signal_name(e.returncode)})" + (f": {tail[-1]}" if tail else "")) from None
    if not reply.get("ok"):
        raise _reply_failure(reply, stage)
    return reply


def _check_reply(reply: dict, ref: Any, atol: float, rtol: float, index: int, io: str | None,
                 precision: dict[str, float] | None = None) -> TrialResult:
    if reply.get("alias"):
        raise StageFailure(Status.INCORRECT, f"trial {index}: {reply['alias'][0]} (return fresh output tensors)",
                           [Violation("alias", reply["alias"][0])])
    if reply.get("mutated"):
        raise StageFailure(Status.INCORRECT, f"trial {index}: {reply['mutated'][0]}", [Violation("input_mutation",
                                                                                                  reply["mutated"][0])])
    try:
        cand_out = wire.decode_value(reply["outputs"], io)
    except (ValueError, KeyError, TypeError) as e:
        raise StageFailure(Status.RUNTIME_ERROR, f"trial {index}: malformed outputs: {e}") from None
    tr = compare(ref, cand_out, atol, rtol, index)
    if tr.ok and precision:
        msg = precision_shortfall(ref, cand_out, precision)
        if msg:
            tr.ok = False
            tr.message = msg
    return tr


def _trial_violations(tr: TrialResult) -> list[Violation]:
    if tr.message.startswith("precision:"):
        return [Violation("precision", tr.message)]
    return []


def _precision_budget(cfg: SandboxConfig) -> dict[str, float]:
    return {"float32": cfg.precision_median_rel_fp32, "float64": cfg.precision_median_rel_fp32} \
        if cfg.precision_median_rel_fp32 > 0 else {}


class Evidence:
    """Runtime evidence of one evaluation: the solution's kernels launched per call (sandbox.runtime counts)
    against the kernels the build defines, and the ATen ops dispatched inside forward (sandbox.guard)."""

    def __init__(self, manifest: str | None, fmt: str):
        import json

        self.fmt = fmt
        self.defined: list[str] = []
        if manifest:
            try:
                m = json.loads(Path(manifest).read_text())
                self.defined = sorted(ep["name"] for a in m.get("artifacts", []) for ep in a.get("entry_points", [])
                                      if isinstance(ep, dict) and "name" in ep)
            except (OSError, ValueError, KeyError, TypeError):
                pass
        self.launched: dict[str, int] = {}
        self.ops: dict[str, int] = {}
        self.notes: list[str] = []

    def add(self, reply: dict, where: str) -> None:
        launches = reply.get("launches") or {}
        for k, v in launches.items():
            self.launched[k] = self.launched.get(k, 0) + int(v)
        for k, v in (reply.get("ops") or {}).items():
            self.ops[k] = self.ops.get(k, 0) + int(v)
        self.notes.extend(reply.get("notes") or [])
        if self.fmt in ("cpu", "cubin") and not launches:
            msg = (f"{where}: forward launched none of the solution's kernels ({', '.join(self.defined) or 'none'} "
                   "defined): the result came from something else")
            raise StageFailure(Status.FORBIDDEN, msg, [Violation("no_kernel_launched", msg)])

    def summary(self) -> list[str]:
        out = list(dict.fromkeys(self.notes))
        if self.fmt in ("cpu", "cubin"):
            never = [k for k in self.defined if k not in self.launched]
            out.append("kernels launched during verification: " +
                       (", ".join(f"{k} x{v}" for k, v in sorted(self.launched.items())) or "none") +
                       (f"; defined but never launched: {', '.join(never)}" if never else ""))
        if self.ops:
            out.append("ATen ops inside forward: " + ", ".join(f"{k} x{v}" for k, v in sorted(self.ops.items())[:12]))
        return out


def _verify_value_variant(cand: CandidateProcess, made: tuple, cfg: SandboxConfig, atol: float, rtol: float,
                          io: str, prec: dict, evidence: Evidence, out: dict) -> None:
    """One more trial whose floating-point inputs are scaled by a random factor in [2, 4): shortcuts that only
    hold for the value range of get_inputs() fail here. Skipped when the reference is not finite there.
    made: (scale, inputs, reference outputs, skip reason) from _value_variant_job (made ahead)."""
    scale, x, ref, skipped = made
    if skipped:
        out["log"].append(skipped)
        return
    idx = len(out["trials"])
    reply = _run(cand, {"op": "run", "inputs": cand.encode_inputs(x, io), "poison": cfg.poison_outputs},
                 cfg.trial_timeout_s, "value-range trial")
    evidence.add(reply, "value-range trial")
    tr = _check_reply(reply, ref, atol, rtol, idx, io, prec)
    out["trials"].append(tr.to_dict())
    if not tr.ok:
        msg = f"inputs scaled by {scale:.2f}: {tr.message}"
        raise StageFailure(Status.INCORRECT, f"value-range trial: {msg}",
                           _trial_violations(tr) or [Violation("value_range", msg)])


def _verify_shape_variants(cand: CandidateProcess, job: dict, state: TaskState, shape_jobs: list, cfg: SandboxConfig,
                           atol: float, rtol: float, io: str, prec: dict, evidence: Evidence, out: dict) -> None:
    """Verify on the task's other shapes (shape_jobs: (overrides of its shape parameters, the future of
    _shape_variant_job)), then give the candidate its default-shape model back for profiling."""
    loaded_other = False
    for ov, fut in shape_jobs:
        vs, xs, refs, skipped = fut.result()
        if skipped:
            out["log"].append(skipped)
            continue
        label = ", ".join(f"{k}={v}" for k, v in ov.items())
        reply = _load(cand, vs, job, io, f"load (shapes {label})")
        loaded_other = True
        for j, (x, ref) in enumerate(zip(xs, refs)):
            reply = _run(cand, {"op": "run", "inputs": cand.encode_inputs(x, io), "poison": cfg.poison_outputs},
                         cfg.trial_timeout_s, f"shapes {label}: trial {j}")
            evidence.add(reply, f"shapes {label}: trial {j}")
            tr = _check_reply(reply, ref, atol, rtol, len(out["trials"]), io, prec)
            out["trials"].append(tr.to_dict())
            if not tr.ok:
                msg = f"shapes {label}: trial {j}: {tr.message}"
                raise StageFailure(Status.INCORRECT, msg, _trial_violations(tr) or [Violation("shape_variant", msg)])
    if loaded_other:
        _load(cand, state, job, io, "load (default shapes)")


def _load(cand: CandidateProcess, st: TaskState, job: dict, io: str, stage: str) -> dict:
    try:
        reply = cand.request({"op": "load", "init_inputs": wire.encode_value(st.init_inputs, io),
                              "state_dict": wire.encode_value(st.state_dict, io)}, job["load_timeout_s"])
    except wire.ChannelTimeout:
        raise StageFailure(Status.TIMEOUT, f"{stage}: ModelNew construction ran past {job['load_timeout_s']:g} s") from None
    except CandidateDied as e:
        _raise_if_thread_started(cand, e, stage)
        raise StageFailure(Status.RUNTIME_ERROR, f"{stage}: the candidate worker died ({_signal_name(e.returncode)})") from None
    if not reply.get("ok"):
        raise _reply_failure(reply, stage)
    return reply


def _has_extension_module(manifest: str | None) -> bool:
    """Whether the build manifest at `manifest` lists an extension module the sandbox built (the extension format's
    workspace layout), so that the solution's load needs no build of its own."""
    try:
        with open(manifest or "") as f:
            return any(a.get("kind") == "ext" for a in json.load(f).get("artifacts", []))
    except (OSError, ValueError, AttributeError, TypeError):
        return False


def _after_load_threads(cand: CandidateProcess, reply: dict, threads0: set | None, filters0: int | None,
                        signals0: set[int] | None, log: list[str]) -> None:
    """After a successful load (sandbox.thread_filter): check that the candidate's thread filter is on and is the
    only seccomp filter its import added (filters0: the count before the load request), and refuse threads, processes,
    POSIX timers or signal handlers the import or ModelNew's construction left (signals0: the tree's caught signals
    before the load request; threads0: the tree's thread ids before the load request; threads of the extension format's load_inline build that are still exiting get 0.2 s). A filter
    that could not be installed after a load_inline import on a host where it works is refused too (the solution's
    native code may have made the install fail). Raises StageFailure(FORBIDDEN, background_thread |
    harness_tampering)."""
    if not cand.thread_filter:
        return
    state = reply.get("thread_filter")
    if state == "on":
        filters = thread_filter.seccomp_filters(cand.pid)
        if thread_filter.filter_active(cand.pid) is False or (
                filters0 is not None and filters is not None and filters != filters0 + 1):
            msg = (f"the candidate reported its thread filter on, but its process runs under {filters} seccomp "
                   f"filter(s) where {0 if filters0 is None else filters0 + 1} (the sandbox's) were expected: a filter "
                   "of the solution's own")
            raise StageFailure(Status.FORBIDDEN, f"load: {msg}", [Violation("harness_tampering", msg)])
        cand.filtered = True
        _check_filter_program(cand)
    elif cand.filter_mode == "after_load" and thread_filter.works_here():
        msg = (f"the thread filter could not be installed after the solution's import ({state or 'not reported'}), "
               "though it installs on this host")
        raise StageFailure(Status.FORBIDDEN, f"load: {msg}", [Violation("harness_tampering", msg)])
    else:
        log.append(f"load: no thread filter in the candidate's process ({state or 'not reported'}): threads it "
                   "starts from here on are not refused")
    timers = thread_filter.posix_timers(cand.pid)
    if timers:
        msg = (f"the solution's import or ModelNew's construction left {timers} POSIX timer(s): a native signal "
               "handler would run work between timed calls, where no clock looks")
        raise StageFailure(Status.FORBIDDEN, f"load: {msg}", [Violation("background_thread", msg)])
    caught = thread_filter.caught_signals(cand.pid)
    added = sorted(caught - signals0) if caught is not None and signals0 is not None else []
    if added:
        names = ", ".join(_signal_number_name(n) for n in added)
        msg = (f"the solution's import or ModelNew's construction installed a signal handler ({names}): a native "
               "handler runs work between timed calls, where no clock looks")
        raise StageFailure(Status.FORBIDDEN, f"load: {msg}", [Violation("background_thread", msg)])
    extra = thread_filter.new_threads(cand.pid, threads0)
    for _ in range(4):
        if not extra:
            return
        time.sleep(0.05)
        extra = thread_filter.new_threads(cand.pid, threads0)
    if extra:
        msg = (f"the solution's import or ModelNew's construction left {len(extra)} thread(s) of its own running "
               f"({', '.join(extra[:4])}): work of a thread runs outside the timed calls, where no clock looks")
        raise StageFailure(Status.FORBIDDEN, f"load: {msg}", [Violation("background_thread", msg)])


def _check_filter_program(cand: CandidateProcess) -> None:
    """Where this host can read a seccomp filter back (thread_filter.programs_readable_here: root, no filter on the
    trusted side), the candidate's newest filter must be the sandbox's program, byte for byte: a filter of the
    solution's own that answers the harness's seccomp() with 0 has the right count (one) but another program (a
    load_inline solution's native code runs before its filter). A candidate that cannot be read where a throwaway
    process can (traced by a process of its own, ...) is refused too. Raises StageFailure(FORBIDDEN,
    harness_tampering)."""
    if not thread_filter.programs_readable_here():
        return
    progs, why = thread_filter.installed_programs(cand.pid)
    if progs is None and not cand.alive():
        return  # it died after its reply: the next request says how
    want = thread_filter.filter_program(platform.machine())
    if progs is None or not progs or any(p != want for p in progs):
        msg = ("the candidate's newest seccomp filter is not the sandbox's thread filter "
               + (f"(it could not be read: {why})" if progs is None else
                  "(none found)" if not progs else f"({len(progs[0]) // 8} instructions, another program)")
               + ": a filter of the solution's own faked the install")
        raise StageFailure(Status.FORBIDDEN, f"load: {msg}", [Violation("harness_tampering", msg)])


def _raise_if_thread_started(cand: CandidateProcess, e: "CandidateDied", stage: str) -> None:
    """A candidate killed by SIGSYS under its thread filter started a thread or process (sandbox.thread_filter): raise
    StageFailure(FORBIDDEN, background_thread); any other death returns."""
    sigsys = int(signal.SIGSYS)
    if cand.filtered and e.returncode in (-sigsys, 128 + sigsys):
        when = "from its import on" if cand.filter_mode == "before_import" else "after its load"
        msg = (f"the candidate's process started a thread, process, timer or signal handler {when} and was killed "
               "by its thread filter (SIGSYS): work of its own could run between timed calls, where no clock looks")
        raise StageFailure(Status.FORBIDDEN, f"{stage}: {msg}", [Violation("background_thread", msg)]) from None


def _tensor_list(v: Any) -> list:
    if isinstance(v, torch.Tensor):
        return [v]
    if isinstance(v, (list, tuple)):
        return [t for x in v for t in _tensor_list(x)]
    return []


REUSE_WARMUP_ROUNDS = 3  # _calibrate with reused costs: unmeasured rounds (of the full calibration's 6)


def _kept_calibration(prev: tuple | None, key: tuple, calib: tuple[float, float, float], ms: float, reused: bool,
                      acquired: bool, cfg: SandboxConfig) -> tuple | None:
    """What TaskState.calibration holds after an evaluation's calibration (SandboxConfig.calibration_reuse_evals):
    (key, fixed_ms, per_call_ms, uses left), or None. A calibration that ran without the timing lock is never
    handed on (measured beside other work); a reuse spends one use; a fresh one of at least
    calibration_reuse_min_ms is kept (a short one costs little to repeat and follows changes of the host's load)."""
    if not acquired:
        return None
    if reused:
        return (key, prev[1], prev[2], prev[3] - 1)
    if ms >= cfg.calibration_reuse_min_ms:
        return (key, calib[1], calib[2], cfg.calibration_reuse_evals)
    return None


def _calibrate(cand: CandidateProcess, x_cpu: list, ref_out: Any, calls: int, io: Any,
               rounds: int = 5, pings: int = 5, log: list | None = None,
               reuse: tuple[float, float] | None = None) -> tuple[float, float, float]:
    """(round trip of an empty request in ms, the harness's fixed cost per time request in ms, its cost per timed
    call in ms), measured before the solution is imported, while only trusted code runs in the candidate's process:
    pings, then `calibrate` requests that go through the time request's path (input sets of the task's shapes, a
    no-op for forward that returns tensors of the reference's output shapes, the copies and checks after each call).

    Requests of 1 call and of `calls` calls alternate, `rounds` of each, after one warm-up round that is discarded
    (the first requests pay one-time costs: the gate's latency measured again, lazy kernel loads, the allocator's
    first blocks; on the H200 one such outlier made a whole evaluation's per-call cost 0). The fixed and the per-call costs are
    separated by the two sizes: cost(n) = fixed + n * per_call, medians of each size. A profile whose repetitions
    time a number of calls other than the calibration's then gets the right estimate. One size alone would spread
    the fixed cost over its n calls: with 4 calls calibrated and 16 timed, the estimate would come out 3 x fixed too
    low, which is time a solution could hide outside its clock. The costs are never measured again: the solution's
    process could delay its answers at will (sandbox.timing).

    reuse: (fixed_ms, per_call_ms) from an earlier evaluation's calibration of the same task on this worker
    (SandboxConfig.calibration_reuse_evals): only the pings and REUSE_WARMUP_ROUNDS unmeasured rounds run, and
    those costs are returned with this process's round trip."""
    rtt = math.inf
    for _ in range(pings):
        tp = time.perf_counter()
        _run(cand, {"op": "ping"}, 30.0, "calibration")
        rtt = min(rtt, (time.perf_counter() - tp) * 1e3)
    zeros = [torch.zeros_like(t) if isinstance(t, torch.Tensor) else t for t in x_cpu]
    outs = [[list(t.shape), str(t.dtype).removeprefix("torch.")] for t in _tensor_list(ref_out)]
    big = max(2, calls)
    costs: dict[int, list[float]] = {1: [], big: []}
    parts: list[dict] = []
    # reusing: 3 warm-up rounds of both sizes, none measured. They touch the memory that the timed calls' outputs
    # and copies take. With 1 or 2 rounds an honest solution's first timed repetitions still ran 3-30x slow on the
    # CPU box, and cost it its reward. The likely cause, found later: a reference cycle through the candidate's
    # thread check (sandbox.integrity.python_threads_in_workspace) that kept each repetition's outputs until a
    # collection, so every timed call faulted in fresh pages; since it is gone, fewer rounds have not been measured
    for k in range(REUSE_WARMUP_ROUNDS if reuse is not None else rounds + 1):
        for n in (1, big):
            rec = cand.encode_inputs([zeros] * n, io)
            with _no_collection():
                tw = time.perf_counter()
                reply = _run(cand, {"op": "calibrate", "input_sets": rec, "outputs": outs}, 30.0, "calibration")
                wall = (time.perf_counter() - tw) * 1e3
            _run(cand, {"op": "sample", "positions": [], "full": -1}, 30.0, "calibration")
            loop, prep = float(reply.get("loop_ms", 0.0)), float(reply.get("prep_ms", 0.0))
            if k and reuse is None:  # round 0: the warm-up (every round, when the costs are reused)
                costs[n].append(max(0.0, wall - rtt - loop - prep))
                if n == big:
                    parts.append(request_parts(reply, wall, rtt, n, tw))
    if reuse is not None:
        return rtt, reuse[0], reuse[1]
    one, many = (_median(costs[1]), _median(costs[big]))
    per_call = max(0.0, (many - one) / (big - 1))
    if log is not None and parts:
        log.append(f"profile: calibration ({big} calls per request; the harness's own report, a diagnostic): "
                   + parts_summary(parts))
    return rtt, max(0.0, one - per_call), per_call


@contextlib.contextmanager
def _no_collection() -> Iterator[None]:
    """This process's garbage collector paused over a trusted wall-clock measurement of a candidate request: a
    collection of the trusted worker's heap costs up to milliseconds at random, which the shortfall rule would
    charge to the candidate (the candidate's process pauses its own over timed requests, sandbox.candidate.serve)."""
    on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if on:
            gc.enable()


def _median(v: list[float]) -> float:
    """The upper median (statistics.median_high), 0.0 for no values."""
    return statistics.median_high(v) if v else 0.0


def request_parts(reply: dict, wall_ms: float, rtt_ms: float, calls: int, sent_s: float | None = None) -> dict:
    """Where one time (or calibrate) request's trusted wall clock went, by the candidate harness's own report
    (handler_ms, run_ms, loop_ms, prep_ms; all ms): a diagnostic for the log, never used for a reward (the
    candidate's process can report anything). Keys: pipe (the wall clock less the round trip and the handler),
    checks (the handler less the timed run and the unpacking: the checks around the request), between_per_call
    (the run less its timed regions, per call: the harness's work between calls), loop_per_call; and, where the
    reply has them, integrity, drop_rep and the between-calls parts per call (l2_limit, l2_reset, flush, setup,
    after, and copies, which is a part of after). sent_s: this process's time.perf_counter() when it began the request (the wall clock's start); with
    the reply's t_recv and t_send (the candidate's clock, the same CLOCK_MONOTONIC) the pipe is split into
    pipe_request (sent to received) and pipe_reply (reply sent to the wall clock's end)."""
    def num(key: str) -> float:
        v = reply.get(key)
        return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else float("nan")

    handler, run, loop, prep = num("handler_ms"), num("run_ms"), num("loop_ms"), num("prep_ms")
    out = {"pipe": wall_ms - rtt_ms - handler, "checks": handler - run - prep, "prep": prep,
           "between_per_call": (run - loop) / calls, "loop_per_call": loop / calls}
    # finer parts where the harness reports them: the integrity checks around the request, the previous
    # repetition's scrub (drop_rep), and the between-calls work per call (l2_limit, l2_reset, flush, setup, after,
    # copies)
    t_recv, t_send = reply.get("t_recv"), reply.get("t_send")
    if sent_s is not None and isinstance(t_recv, float) and isinstance(t_send, float):
        out["pipe_request"] = (t_recv - sent_s) * 1e3
        out["pipe_reply"] = (sent_s + wall_ms / 1e3 - t_send) * 1e3
    if "integrity_ms" in reply:
        out["integrity"] = num("integrity_ms")
    parts = reply.get("between_ms")
    if isinstance(parts, dict):
        for k in ("drop_rep", "l2_limit", "l2_reset", "flush", "setup", "after", "copies"):
            v = parts.get(k)
            if isinstance(v, (int, float)) and math.isfinite(v):
                out[k if k == "drop_rep" else f"{k}_per_call"] = float(v) if k == "drop_rep" else float(v) / calls
    return out


def parts_summary(parts: list[dict]) -> str:
    """Medians of request_parts records, one 'key a.bcd ms' item each."""
    keys = list(dict.fromkeys(k for p in parts for k in p))
    items = []
    for k in keys:
        vals = [p[k] for p in parts if k in p and math.isfinite(p[k])]
        items.append(f"{k} {_median(vals):.3f} ms" if vals else f"{k} -")
    return ", ".join(items)


def _profile(cand: CandidateProcess, state: TaskState, plan: ProfilePlan, pf: Prefetch, x0: list, cfg: SandboxConfig,
             cuda: bool, device: str, atol: float, rtol: float, out: dict, io: str, fmt: str,
             prec: dict, calib: tuple[float, float, float]) -> TimingStats:
    """Interleaved repetitions of eager, torch.compile and the candidate on fresh inputs per call (see the module
    doc of sandbox.timing for what is trusted). Each repetition: `calls` input sets from fresh seeds (made ahead
    by the Prefetch thread, which is held idle around every timed region, or here), the same for the three; the candidate
    gets them (through its input segment) only just before its timed calls of that repetition; its outputs of every
    call are checked at random positions chosen after the call, and one call's outputs in full, against eager's
    outputs on the same inputs. x0: a trial's inputs on the device (torch.compile's example)."""
    deadline = time.monotonic() + cfg.profile_timeout_s
    with pf.quiet():  # the gate latency is measured with the input thread held (its GPU work would count in it)
        timer = trusted_timer(cfg, cuda, device, plan.flush, fmt)
    # the gate latency _event_floor forgives per gated call: with the gate's own L2 flush, the trusted side's measure
    floor_lat = timer.gate_latency_ms if cfg.timing_gate_flush else 0.05
    rng = secrets.SystemRandom()

    def left() -> float:
        rem = deadline - time.monotonic()
        if rem <= 0:
            raise StageFailure(Status.TIMEOUT, f"profile: ran past {cfg.profile_timeout_s:g} s")
        return rem

    def eager(a: list) -> Any:
        with torch.no_grad():
            return state.model(*a)

    # torch.compile's first call and its graphs run with the input thread held (as when timed); compiled here, at
    # cpu_threads torch threads (part of inductor's cache key on the CPU), as sandbox.prewarm compiles it ahead
    with pf.quiet():
        compiled = state.compiled_model(cfg.compile_mode, x0) if cfg.use_compile else None
    if state.compile_error:
        out["log"].append(state.compile_error)

    def comp(a: list) -> Any:
        with torch.no_grad():
            return compiled(*a)

    # the round trip and the harness's own cost per call, measured before any solution code existed (_calibrate):
    # pings the solution's process answers now could be delayed at will
    rtt, fixed, ovh = calib
    out["log"].append(f"profile: calibrated before the import: round trip {rtt:.3f} ms, harness {fixed:.3f} ms per "
                      f"request + {ovh:.3f} ms per timed call")
    if cuda:
        idx = torch.device(device).index or 0
        r = _nvml(idx)
        if r:
            out["nvml"].append({**r, "when": "profile_start"})
    # warm-up (fresh inputs for the candidate too), as large as a timed repetition: warmup_calls sets at least and
    # no fewer than the repetition's calls, for the three alike (eager keeps its outputs over the request, as a
    # repetition does). A smaller warm-up left the first repetition's outputs (and the harness's copies) on memory
    # the candidate's process had never touched: page faults inside its timed calls
    warm: list = []
    warm_dev: list = []

    def warm_baselines() -> None:
        kept: list = []
        with pf.quiet():
            timer.run(eager, warm_dev, kept.append, label="eager")
            scrub_device(kept)
            del kept[:]
            if compiled is not None:
                timer.run(comp, warm_dev, label="compiled")

    if cfg.warmup_calls:
        warm = [f.result() for f in plan.warmup]
        warm += _make_sets(state, warmup_sets(cfg, plan.calls) - len(warm))
        warm_dev = [state.to_device(x) for x in warm]
        warm_baselines()
    with pf.quiet():
        one = timer.run(eager, [x0], label="eager")["ms_per_call"]
    calls = calls_per_rep(cfg, one, plan.in_bytes)
    if cfg.warmup_calls:
        if len(warm) < calls:  # more calls than the reference stage's estimate: the baselines' warm-up again, at size
            extra = _make_sets(state, calls - len(warm))
            warm += extra
            warm_dev += [state.to_device(x) for x in extra]
            del extra
            warm_baselines()
        _run(cand, {"op": "time", "input_sets": cand.encode_inputs(warm, io)}, left(), "profile warm-up")
        _run(cand, {"op": "sample", "positions": [], "full": -1}, left(), "profile warm-up")
        out["log"].append(f"profile: warm-up of {len(warm)} call(s) each (untimed; {calls} call(s) per repetition)")
    n_warm = len(warm)
    del warm, warm_dev
    impls = ["eager", "candidate"] + (["compiled"] if compiled is not None else [])
    samples: dict[str, list[float]] = {k: [] for k in impls}
    walls: list[float] = []
    disagreements = 0
    charged: list[bool] = []  # per candidate repetition: its sample already carries its whole shortfall
    cand_gated = 0
    cand_side = 0
    cand_host: list[float] = []
    ratios: list[float] = []
    shortfalls: list[float] = []
    ests: list[float] = []
    parts: list[dict] = []  # request_parts of each candidate repetition (diagnostic)
    cpu_over: list[float] = []  # CPU backend, per candidate repetition: CPU ms beyond cpu_threads x its wall clock
    cpu_walls: list[float] = []
    full_done = False
    early = cfg.early_stop_reps if 0 < cfg.early_stop_reps < cfg.reps else 0
    # with early stopping, the full check falls in a random one of the first `early` repetitions (one may end there)
    first_full = rng.randrange(early) if early else -1
    stopped_at = 0

    harness_slack_ms = cfg.timing_slack_harness_rel * (fixed + calls * ovh)  # the slack's harness part, per repetition

    def charged_candidate() -> tuple[list[float], float, float]:
        loops = [e - sh for e, sh in zip(ests, shortfalls)]
        return charge_shortfall(samples["candidate"], ests, loops, calls, cfg.timing_slack_ms, cfg.timing_slack_rel,
                                charged, harness_slack_ms)

    def settled() -> bool:
        """The milestone on the repetitions so far, at early_stop_level, cannot change (stats.milestone_settled)."""
        cand_ms = charged_candidate()[0]
        lvl, n = cfg.early_stop_level, cfg.bootstrap_samples
        se = bootstrap_speedup(samples["eager"], cand_ms, n, lvl)
        sc = bootstrap_speedup(samples["compiled"], cand_ms, n, lvl) if compiled is not None else None
        return milestone_settled(se, sc, cfg.faster_than_eager, cfg.faster_than_compile, cfg.top_margin)

    def rep_sets(r: int) -> list:
        made, plan.reps[r] = plan.reps[r], []  # each set is used by one repetition, then freed
        for f in made[calls:]:
            f.cancel()
        sets = [f.result() for f in made[:calls]]
        return sets + _make_sets(state, calls - len(sets))

    for r in range(cfg.reps):
        # this repetition's sets reach the candidate with its time request, not before (nothing of them is in its
        # process while it is not being timed)
        sets = rep_sets(r)
        tx = time.perf_counter()
        sets_dev = [state.to_device(x) for x in sets]
        if cuda:
            torch.cuda.synchronize()
        h2d_ms = (time.perf_counter() - tx) * 1e3
        # a reference that writes its inputs: torch.compile gets sets of its own (eager's outputs are the reference)
        sets_comp = ([state.to_device(x) for x in sets] if state.mutates_inputs and compiled is not None
                     else sets_dev)
        ref_outs: list = []
        order = impls[r % len(impls):] + impls[: r % len(impls)]
        for im in order:
            t_im = time.perf_counter()
            if im == "eager":
                with pf.quiet():
                    res = timer.run(eager, sets_dev, ref_outs.append, label="eager")
                samples[im].append(res["ms_per_call"])
            elif im == "compiled":
                with pf.quiet():
                    samples[im].append(timer.run(comp, sets_comp, label="compiled")["ms_per_call"])
            else:
                with pf.quiet():
                    te = time.perf_counter()
                    rec = cand.encode_inputs(sets, io)  # into the segment (or spill files) now, before the clock
                    enc_ms = (time.perf_counter() - te) * 1e3
                    c0 = tree_cpu_s(cand.pid, precise=True) if not cuda else None
                    with _no_collection():
                        tw = time.perf_counter()
                        reply = _run(cand, {"op": "time", "input_sets": rec}, left(), "profile")
                        wall = (time.perf_counter() - tw) * 1e3
                    c1 = tree_cpu_s(cand.pid, precise=True) if c0 is not None else None
                del rec
                walls.append(wall / calls)
                if fmt in ("cpu", "cubin") and not reply.get("launches"):
                    msg = "timed calls launched none of the solution's kernels"
                    raise StageFailure(Status.FORBIDDEN, f"profile: {msg}", [Violation("no_kernel_launched", msg)])
                cand_gated += _reply_count(reply, "gated")
                cand_side += _reply_count(reply, "gate_side")
                if isinstance(reply.get("host_ms"), float):
                    cand_host.append(reply["host_ms"])
                loop = float(reply.get("loop_ms", float("nan")))
                ev = float(reply.get("event_ms", float("nan")))
                if not (loop > 0 and math.isfinite(loop) and ev > 0 and math.isfinite(ev)):
                    raise StageFailure(Status.RUNTIME_ERROR, f"profile: the candidate reported a bad time {loop!r}")
                ms = ev / calls
                est = trusted_estimate(wall, rtt, ovh, calls, reply.get("prep_ms"), enc_ms + h2d_ms, fixed)
                ests.append(est)
                parts.append({**request_parts(reply, wall, rtt, calls, tw), "trusted_prep": enc_ms + h2d_ms})
                ratios.append(loop / max(est, 1e-6))
                shortfalls.append(est - loop)
                full_charge = True
                if loop > wall + 0.5:  # more in-process time than the wall clock around it: not believed
                    ms = max(est, loop) / calls
                elif not agrees_with_estimate(loop, wall, est, rtt):  # a gross shortfall: charged in full
                    ms = (ev + max(est - loop, 0.0)) / calls
                elif cuda and (ev > loop + 0.1 or ev < _event_floor(loop, calls, reply, cfg, fmt, floor_lat)):
                    ms = loop / calls
                else:
                    full_charge = False
                disagreements += full_charge
                charged.append(full_charge)
                if c0 is not None and c1 is not None:
                    # CPU backend: CPU time beyond cpu_threads cores over the request's wall clock is work done on
                    # cores the baselines did not get (a thread of the solution's own, native ones included): it is
                    # charged as if those threads had run it
                    over = max(0.0, (c1 - c0) * 1e3 - cfg.cpu_threads * wall - 0.02)
                    cpu_over.append(over)
                    cpu_walls.append(wall)
                    ms += over / max(cfg.cpu_threads, 1) / calls
                samples[im].append(ms)
            # the repetition's timed requests, their trusted bookkeeping included (the profile's rest: input
            # transfer, output checks, the early-stop look, gate and warm-up)
            st_ms = out["stage_ms"]
            st_ms["profile_timed"] = st_ms.get("profile_timed", 0.0) + (time.perf_counter() - t_im) * 1e3
        if early:
            full = r == first_full or rng.random() < max(cfg.full_checks - 1.0, 0.0) / cfg.reps
        else:
            full = rng.random() < cfg.full_checks / cfg.reps or (r == cfg.reps - 1 and not full_done)
        full_done = full_done or full
        # the sample request (the checks of the repetition's copies) is timed by nothing: work a thread of the
        # solution's own does there beyond cpu_threads cores (filling the harness's copies, say) is parallel work too
        c0 = tree_cpu_s(cand.pid, precise=True) if not cuda else None
        ts = time.perf_counter()
        with _threads(_compare_threads(cfg, cuda)):
            _check_timed(cand, ref_outs, atol, rtol, io, rng, r, prec, full)
        if c0 is not None:
            c1 = tree_cpu_s(cand.pid, precise=True)
            sw = (time.perf_counter() - ts) * 1e3
            if c1 is not None:
                over = max(0.0, (c1 - c0) * 1e3 - cfg.cpu_threads * sw - 0.02)
                cpu_over.append(over)
                cpu_walls.append(sw)
                samples["candidate"][-1] += over / max(cfg.cpu_threads, 1) / calls
        scrub_device(ref_outs)
        del sets, sets_dev, sets_comp, ref_outs
        if early and r + 1 >= early and r + 1 < cfg.reps and full_done and settled():
            stopped_at = r + 1
            break
    if stopped_at:
        for made in plan.reps[stopped_at:]:  # sets made ahead for repetitions that will not run: dropped
            for f in made:
                f.cancel()
        plan.reps[stopped_at:] = [[] for _ in plan.reps[stopped_at:]]
        out["log"].append(f"profile: the milestone was settled after {stopped_at} of {cfg.reps} repetitions (its "
                          f"{cfg.early_stop_level:.0%} intervals clear every threshold); the rest were not run")
    if cpu_over and sum(cpu_over) > max(2.0, 0.1 * cfg.cpu_threads * sum(cpu_walls)):
        msg = (f"the candidate's process used {sum(cpu_over):.1f} ms of CPU beyond {cfg.cpu_threads} thread(s) over "
               f"its time and sample requests ({sum(cpu_walls):.1f} ms of wall clock): threads of its own beyond the "
               "baselines' (SandboxConfig.cpu_threads)")
        raise StageFailure(Status.FORBIDDEN, f"profile: {msg}", [Violation("parallel_work", msg)])
    if sum(cpu_over) > 0.01:
        out["log"].append(f"profile: the candidate's process used {sum(cpu_over):.2f} ms of CPU beyond "
                          f"{cfg.cpu_threads} thread(s) over its time and sample requests; charged to its repetitions")
    med_ratio = _median(ratios) if ratios else 1.0
    med_short = _median(shortfalls)
    if med_ratio < 0.1 and med_short > 2.0:
        msg = (f"the candidate's in-process timings cover a median {med_ratio:.0%} of the trusted wall clock around "
               f"its repetitions (median shortfall {med_short:.1f} ms, request round trip {rtt:.2f} ms)")
        raise StageFailure(Status.FORBIDDEN, f"profile: {msg}", [Violation("timer_tampering", msg)])
    if parts:
        out["log"].append(f"profile: candidate time requests ({calls} call(s) each; the harness's own report, a "
                          "diagnostic): " + parts_summary(parts))
    if cand_gated and cand_host:
        out["log"].append(f"profile: gated; the candidate's host time inside each call, median "
                          f"{_median(cand_host):.3f} ms (allowance {timer.host_allowance_ms:g} ms, "
                          f"gate latency {timer.gate_latency_ms:.3f} ms on the trusted side)")
    if cand_side:
        out["log"].append(f"profile: {cand_side} of the candidate's timed calls put work on another stream than the "
                          "one they were called on (or left another stream current): each counted its whole wall "
                          "clock, host time included (the timing gate holds the SMs, not the copy engines)")
    if timer.gate is not None and cand_gated == 0 and cand_side == 0:
        out["log"].append("profile: eager and torch.compile were timed behind the timing gate, the candidate without "
                          "it (its gate did not load, or expired: a call that synchronises the device); its times "
                          "include the host's time to enqueue each call")
    if disagreements:
        out["log"].append(f"profile: {disagreements} of {len(samples['candidate'])} candidate repetitions disagreed "
                          "with the trusted wall clock; their figures were replaced (a shortfall against the trusted estimate charged "
                          "in full, or the wall clock used)")
    # less than the trusted wall clock allows: each repetition is charged its own shortfall beyond the slack (a liar
    # gains at most the slack in any repetition; an honest figure changes only where it is that far short)
    floored, med_short, limit = charged_candidate()
    n_charged = sum(a != b for a, b in zip(floored, samples["candidate"]))
    if n_charged:
        samples["candidate"] = floored
        out["log"].append(f"profile: {n_charged} of {len(floored)} candidate repetitions fell short of the trusted "
                          f"wall clock by more than the slack ({limit:.2f} ms; median shortfall {med_short:.2f} ms per "
                          "repetition); each was charged its shortfall beyond the slack")
    if cuda:
        r = _nvml(torch.device(device).index or 0)
        if r:
            out["nvml"].append({**r, "when": "profile_end"})
    se = bootstrap_speedup(samples["eager"], samples["candidate"], cfg.bootstrap_samples, cfg.ci_level)
    sc = (bootstrap_speedup(samples["compiled"], samples["candidate"], cfg.bootstrap_samples, cfg.ci_level)
          if compiled is not None else None)
    level, why = milestone(se, sc, cfg.faster_than_eager, cfg.faster_than_compile, cfg.top_margin)
    state.last_baselines = {k: v for k, v in samples.items() if k != "candidate"}
    return TimingStats(
        device=torch.cuda.get_device_name(device) if cuda else "cpu",
        calls_per_rep=calls, warmup_calls=n_warm,
        eager=distribution(samples["eager"]),
        compiled=distribution(samples["compiled"]) if compiled is not None else None,
        candidate=distribution(samples["candidate"]),
        speedup_eager=se, speedup_compile=sc, candidate_wall_ms=walls, baseline_policy="interleaved",
        milestone=level, milestone_reason=why,
    )


def _reply_count(reply: dict, key: str) -> int:
    """A count the candidate's reply carries (`gated`, `gate_side`): a non-negative int, else 0 (a forged or
    malformed field counts as nothing gated, the stricter reading)."""
    v = reply.get(key, 0)
    return v if type(v) is int and v > 0 else 0


def _event_floor(loop_ms: float, calls: int, reply: dict, cfg: SandboxConfig, fmt: str = "cubin",
                 gate_latency_ms: float = 0.05) -> float:
    """The least a candidate's CUDA figure for a repetition (reply's event_ms) may claim against its own in-loop
    wall clock (loop_ms) before the wall clock is used instead. Ungated, at least half of it; gated (the calls'
    host time is outside the events, sandbox.timing.Timer.run), half of it less the host allowance and the gate
    latency per call (gate_latency_ms, at least 50 us: with SandboxConfig.timing_gate_flush the gate's L2 flush is
    part of it, and the caller passes the trusted side's own measurement): a gated figure is the largest of the
    GPU's and the host's parts, so at least their mean."""
    gated = _reply_count(reply, "gated")
    if gated > 0:
        lat = max(0.05, float(gate_latency_ms))
        return 0.5 * (loop_ms - gated * (gate_allowance_ms(cfg, fmt) + lat)) - 0.05 * calls
    return 0.5 * loop_ms - 0.05 * calls


def _check_timed(cand: CandidateProcess, ref_outs: list, atol: float, rtol: float, io: str,
                 rng: "secrets.SystemRandom", rep: int, prec: dict, full_check: bool) -> None:
    """Check one repetition's timed outputs (the copies the candidate's harness made right after each call): every
    call at random positions (chosen now, after the calls), and, when full_check, one call in full. A mismatch is
    `incorrect` with a `timed_output_mismatch` violation (replayed or cached outputs, work skipped or deferred while
    timed)."""
    # the reference outputs stay where eager made them: only the sampled positions travel to the CPU (copying every
    # call's outputs moved calls x output bytes per repetition, with the timing lock held)
    refs = [[t.detach() for t in _tensor_list(o)] for o in ref_outs]
    if not refs or not refs[0]:
        _run(cand, {"op": "sample", "positions": [], "full": -1}, 60.0, "profile check")
        return
    positions = [sorted(rng.sample(range(t.numel()), min(64, t.numel()))) if t.numel() else [] for t in refs[0]]
    full = rng.randrange(len(refs)) if full_check else -1
    for k, row in enumerate(refs):  # indexing on the device past the end would break the worker's CUDA context
        if len(row) != len(refs[0]) or any(t.numel() != t0.numel() for t, t0 in zip(row, refs[0])):
            raise StageFailure(Status.INTERNAL_ERROR, f"profile check: the reference's outputs of timed call {k} "
                               "differ in number or size from call 0's (a task's outputs must have fixed sizes)")
    idx = [torch.tensor(p, dtype=torch.long, device=t.device) for p, t in zip(positions, refs[0])]
    reply = _run(cand, {"op": "sample", "positions": positions, "full": full}, 60.0, "profile check")
    try:
        got = wire.decode_value(reply["samples"], io)
        full_out = wire.decode_value(reply["full"], io) if reply.get("full") is not None else None
    except (ValueError, KeyError, TypeError) as e:
        raise StageFailure(Status.RUNTIME_ERROR, f"profile check: malformed samples: {e}") from None
    if not isinstance(got, list) or len(got) != len(refs):
        raise StageFailure(Status.INCORRECT, "profile check: timed outputs missing",
                           [Violation("timed_output_mismatch", "the timed calls' outputs are missing")])
    for k, (row, ref) in enumerate(zip(got, refs)):
        if not isinstance(row, list) or len(row) != len(ref):
            msg = f"repetition {rep}, timed call {k}: output structure differs"
            raise StageFailure(Status.INCORRECT, f"profile: {msg}", [Violation("timed_output_mismatch", msg)])
        for j, (vals, rt) in enumerate(zip(row, ref)):
            if not positions[j]:
                continue
            rv = rt.reshape(-1)[idx[j]].cpu()
            tr = compare(rv, vals, atol, rtol, k)
            if not tr.ok:
                msg = f"repetition {rep}, timed call {k}, output {j}: {tr.message}"
                raise StageFailure(Status.INCORRECT, f"profile: {msg}", [Violation("timed_output_mismatch", msg)])
    if full < 0:
        return
    tr = compare(_to_cpu(ref_outs[full]), full_out, atol, rtol, full)
    if tr.ok and prec:
        p = precision_shortfall(_to_cpu(ref_outs[full]), full_out, prec)
        if p:
            raise StageFailure(Status.INCORRECT, f"profile: {p}", [Violation("precision", p)])
    if not tr.ok:
        msg = f"repetition {rep}, timed call {full} (full check): {tr.message}"
        raise StageFailure(Status.INCORRECT, f"profile: {msg}", [Violation("timed_output_mismatch", msg)])


# ----------------------------------------------------------------------------------------------------- process
def worker_main(conn: Any, cfg_dict: dict) -> None:
    """Entry point of the trusted worker process (multiprocessing, spawn). Serves jobs until 'exit' or EOF."""
    cfg = SandboxConfig(**cfg_dict)
    torch.set_num_threads(cfg.cpu_threads)
    os.environ.setdefault("OMP_NUM_THREADS", str(cfg.cpu_threads))
    cache: collections.OrderedDict = collections.OrderedDict()
    spares = WorkerPool(cfg, use_zygote=os.environ.get("CUDA_AGENT_SANDBOX_ZYGOTE", "1") != "0")
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):
            spares.close()
            return
        op = job.get("op")
        if op == "exit":
            spares.close()
            return
        try:
            if op == "evaluate":
                # the job's own peak: above what this process held before it (other tasks' cached references)
                base = 0
                if torch.cuda.is_initialized():
                    base = torch.cuda.memory_reserved()
                    torch.cuda.reset_peak_memory_stats()
                res = run_job(job, cache, cfg, spares)
                if torch.cuda.is_initialized():
                    res["device_peak_bytes"] = max(0, int(torch.cuda.max_memory_reserved()) - base)
            elif op == "ping":
                res = {"ok": True, "pid": os.getpid()}
            else:
                res = {"status": Status.INTERNAL_ERROR.value, "message": f"unknown op {op!r}"}
        except Exception as e:  # noqa: BLE001 - the worker keeps serving
            res = {"status": Status.INTERNAL_ERROR.value, "message": f"trusted worker: {type(e).__name__}: {e}",
                   "detail": traceback.format_exc()[-2000:]}
            if isinstance(e, torch.cuda.OutOfMemoryError):  # trusted code out of device memory: the same evidence
                spares.await_teardown()
                res["device_free_fraction"] = _device_free_fraction()
        try:
            conn.send(res)
        except (OSError, ValueError):
            return
        if torch.cuda.is_initialized():
            # Give the caching allocator's free blocks back to the device between evaluations (after the reply,
            # off the caller's path): GPU-sized tasks (eager footprints up to 16 GiB) left 19-23 GiB reserved per
            # process, which the other users of the GPU (more evaluators, a sampler, a learner) could not have: 4
            # evaluators side by side ran the H200 out of memory.
            torch.cuda.empty_cache()


def main(argv: list[str] | None = None) -> None:
    """`python -m sandbox.reference_worker --fd N --config JSON`: serve jobs on the inherited socket fd N."""
    import argparse
    import json
    from multiprocessing.connection import Connection

    ap = argparse.ArgumentParser()
    ap.add_argument("--fd", type=int, required=True)
    ap.add_argument("--config", required=True)
    a = ap.parse_args(argv)
    _pdeathsig()
    worker_main(Connection(a.fd), json.loads(a.config))


if __name__ == "__main__":
    main()
