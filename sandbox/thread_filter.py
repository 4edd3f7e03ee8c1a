"""No new threads, processes or timers once the solution is loaded: a seccomp filter in the candidate's process, and
the trusted side's look at what the load left running.

Why: a thread of the solution's own can run work where no clock looks. On the CPU backend, the CPU-time check of the
time and sample requests (sandbox.reference_worker: `parallel_work`, `background_work`) charges it. On the CUDA
backend that check is off (a CUDA process burns CPU in its synchronisations), and a native thread needs almost no
CPU to launch GPU work between timed calls, while the harness copies and checks the outputs and flushes L2: that work
is seen by neither the in-process clock nor the trusted wall clock (tests/integrity/solutions/gpu_ext_overlap).

The defence, in two parts:
- `make_installer()` is called in the candidate's `setup`, before any solution code exists; it builds the filter
  program and binds the libc calls. The installer it returns runs just before the first `load` imports the solution
  (every format the sandbox built: cpu, cubin, the extension format's workspace layout), or at the end of a
  successful `load` for a `load_inline` solution, whose build in the load needs processes and threads. From then
  on, any thread or process the candidate's process starts (clone, fork, vfork) kills the whole process with SIGSYS
  (SECCOMP_RET_KILL_PROCESS); clone3 is refused with ENOSYS, so libc falls back to clone. A process counts too: one
  made with CLONE_VM shares the memory like a thread, and a forked one could run work of its own (Python-level
  process creation is refused earlier, by the monitor). So do timer_create, setitimer, alarm and an rt_sigaction
  that installs a signal handler: a handler runs code on the main thread between calls with no thread at all, and
  its signals can come from sources no list of syscalls closes (a perf_event_open counter's overflow or an io_uring
  write into an O_ASYNC pipe: a second red-team pass found both). Two exceptions: a query (act NULL) is allowed, and
  SIGABRT's reset by glibc's abort() fails with EPERM instead of killing, so an honest abort in the jail's PID 1 is
  still a crash (filter_program). A syscall of another ABI than the process's own (i386 `int 0x80`, x32) kills it
  too: it would bypass the numbers checked.
  SECCOMP_FILTER_FLAG_TSYNC puts the filter on every thread already there (the CUDA driver's included).
- The trusted side reads /proc before `load` and after its reply: the process must run under exactly one more
  seccomp filter than before (`seccomp_filters`: a filter of the solution's own, e.g. one that answers the
  harness's seccomp() with 0 to fake the install, is refused), with no POSIX timer (`posix_timers`) and no thread or
  process of the tree that the import or the constructor started and left running (`thread_ids`, `new_threads`), and
  no signal handler the import added (`caught_signals`).
  After a load_inline import, an install that reports failure is refused where the filter works on the host
  (`works_here`). Where the trusted side can read a filter back (`installed_programs`: ptrace
  PTRACE_SECCOMP_GET_FILTER, root with no filter of its own; `programs_readable_here`), the newest filter must be
  this module's program byte for byte, which closes the load_inline case of one filter of the solution's own that
  fakes the install (the count alone cannot tell it). Residual, where it cannot read it back: that case.

Applied on the CPU backend when SandboxConfig.cpu_threads is 1 (SandboxConfig.thread_filter; OpenMP teams of the
solution's own need threads beyond that, and the CPU-time check covers them), and on the CUDA backend with
SandboxConfig.thread_filter_cuda (on by default). Linux on x86_64 or aarch64; elsewhere
the installer reports why it did nothing, and the trusted side logs it.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import platform
import struct
import threading
from typing import Callable

log = logging.getLogger(__name__)

# seccomp_data (linux/seccomp.h): int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6]
_NR, _ARCH = 0, 4
_ARGS = 16  # args[i] at _ARGS + 8 * i; its low 32 bits first (x86_64 and aarch64 Linux are little-endian)
# per machine: AUDIT_ARCH_*, the x32 bit (0: none), __NR_seccomp, __NR_clone3, __NR_rt_sigaction, and the syscalls
# that kill: clone, fork, vfork (a thread or a process; aarch64 has no fork / vfork syscalls, libc makes them with
# clone) and the timers (timer_create, setitimer, alarm). rt_sigaction that installs a handler kills too: a signal
# handler runs code on the main thread between calls without a thread, and its signals can come from sources no
# list of syscalls closes (perf_event_open overflow, io_uring writes into an O_ASYNC pipe, ...)
_ABI = {
    "x86_64": dict(arch=0xC000003E, x32=0x40000000, seccomp=317, clone3=435, rt_sigaction=13,
                   kill={"clone": 56, "fork": 57, "vfork": 58, "timer_create": 222, "setitimer": 38, "alarm": 37}),
    "aarch64": dict(arch=0xC00000B7, x32=0, seccomp=277, clone3=435, rt_sigaction=134,
                    kill={"clone": 220, "timer_create": 107, "setitimer": 103}),
}
_RET_KILL_PROCESS, _RET_ALLOW, _RET_ERRNO = 0x80000000, 0x7FFF0000, 0x00050000
_PR_SET_NO_NEW_PRIVS, _SECCOMP_SET_MODE_FILTER, _SECCOMP_FILTER_FLAG_TSYNC = 38, 1, 1
_EPERM, _ENOSYS, _SIGABRT = 1, 38, 6
# classic BPF opcodes: BPF_LD|BPF_W|BPF_ABS, BPF_JMP|BPF_JEQ|BPF_K, BPF_JMP|BPF_JGE|BPF_K, BPF_RET|BPF_K
_LD, _JEQ, _JGE, _RET = 0x20, 0x15, 0x35, 0x06


def filter_program(machine: str) -> bytes:
    """The filter as struct sock_filter[] bytes (8 bytes an instruction: u16 code, u8 jt, u8 jf, u32 k) for
    `machine` (platform.machine()): the syscalls of _ABI[machine]["kill"] kill the process, clone3 fails with
    ENOSYS (libc then uses clone), a syscall of another ABI kills it. rt_sigaction: a query (act NULL) is allowed,
    setting SIGABRT's disposition fails with EPERM (glibc's abort() resets it to SIG_DFL when its first raise comes
    back, as it does in the PID 1 of the jail's PID namespace: the process then dies by the SIGSEGV of abort's
    last resort, an honest crash, not a kill by the filter), any other install kills. Everything else is allowed.
    Raises ValueError for a machine not in _ABI."""
    if machine not in _ABI:
        raise ValueError(f"no thread filter for machine {machine!r} (known: {', '.join(sorted(_ABI))})")
    abi = _ABI[machine]
    kill = (_RET, 0, 0, _RET_KILL_PROCESS)
    prog = [
        (_LD, 0, 0, _ARCH),
        (_JEQ, 1, 0, abi["arch"]),     # another ABI (i386 int 0x80 on x86_64): kill
        kill,
        (_LD, 0, 0, _NR),
    ]
    if abi["x32"]:
        prog += [(_JGE, 0, 1, abi["x32"]), kill]  # x32 numbers: kill
    prog += [(_JEQ, 0, 1, abi["clone3"]),
             (_RET, 0, 0, _RET_ERRNO | _ENOSYS)]  # clone3's flags sit in memory a filter cannot read: libc falls back
    nrs = sorted(abi["kill"].values())
    prog += [(_JEQ, len(nrs) - i + 1, 0, nr) for i, nr in enumerate(nrs)]  # each jumps to the kill below
    prog += [(_JEQ, 2, 0, abi["rt_sigaction"]),  # to the rt_sigaction block
             (_RET, 0, 0, _RET_ALLOW),
             kill,
             # rt_sigaction(sig, act, oldact, sigsetsize): act == NULL (both halves of args[1]) is a query
             (_LD, 0, 0, _ARGS + 8), (_JEQ, 0, 2, 0),
             (_LD, 0, 0, _ARGS + 12), (_JEQ, 3, 0, 0),   # to the allow at the end
             (_LD, 0, 0, _ARGS), (_JEQ, 0, 2, _SIGABRT),  # sig is an int: its low 32 bits
             (_RET, 0, 0, _RET_ERRNO | _EPERM),
             (_RET, 0, 0, _RET_ALLOW), kill]
    return b"".join(struct.pack("=HBBI", *ins) for ins in prog)


def make_installer() -> Callable[[], str]:
    """Build the filter and bind the calls that install it, now (before solution code exists); return the
    installer. The installer takes no argument, installs the filter on every thread of this process and returns
    "on", or a reason it could not ("unsupported: ..."); it never raises. Once on, the process cannot take the
    filter off, and must leave with os._exit (Python's finalisation puts signal handlers back: rt_sigaction)."""
    machine = platform.machine()
    if machine not in _ABI or not os.path.exists("/proc/self/status"):
        reason = f"unsupported: no thread filter for {platform.system()} {machine}"
        return lambda: reason
    prog = ctypes.create_string_buffer(filter_program(machine))
    n = len(prog.raw) // 8

    class _Fprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = _Fprog(n, ctypes.addressof(prog))
    libc = ctypes.CDLL(None, use_errno=True)
    prctl, syscall = libc.prctl, libc.syscall
    prctl.restype = syscall.restype = ctypes.c_long
    nr_seccomp = _ABI[machine]["seccomp"]
    get_errno, strerror = ctypes.get_errno, os.strerror
    keep = (prog, fprog)  # the program's memory lives as long as the installer

    def install() -> str:
        _ = keep
        if prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            return f"unsupported: prctl(PR_SET_NO_NEW_PRIVS) failed: {strerror(get_errno())}"
        rc = syscall(nr_seccomp, _SECCOMP_SET_MODE_FILTER, _SECCOMP_FILTER_FLAG_TSYNC, ctypes.byref(fprog))
        if rc != 0:
            return f"unsupported: seccomp(SECCOMP_SET_MODE_FILTER) returned {rc}: {strerror(get_errno())}"
        return "on"

    return install


def _status_fields(pid: int, *names: str) -> dict[str, str]:
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in names:
                    out[key] = value.strip()
    except OSError:
        pass
    return out


def tree_pids(pid: int) -> list[int]:
    """Process `pid` and its descendants (children through /proc/PID/task/TID/children), `pid` first; [] when pid
    cannot be read. A candidate started through `unshare --fork` runs as the child of `pid`."""
    out, stack, seen = [], [pid], set()
    while stack:
        p = stack.pop()
        if p in seen:
            continue
        seen.add(p)
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        out.append(p)
        for t in tasks:
            try:
                with open(f"/proc/{p}/task/{t}/children", "rb") as f:
                    stack.extend(int(c) for c in f.read().split())
            except (OSError, ValueError):
                pass
    return out


def thread_ids(pid: int) -> set[tuple[int, int]] | None:
    """(process id, thread id) of every thread of process `pid` and its descendants as /proc lists them now, or
    None when pid cannot be read."""
    out = set()
    for p in tree_pids(pid):
        try:
            out |= {(p, int(t)) for t in os.listdir(f"/proc/{p}/task")}
        except (OSError, ValueError):
            continue
    return out or None


def new_threads(pid: int, before: set[tuple[int, int]] | None) -> list[str]:
    """Threads of `pid`'s tree running now that were not in `before` (thread_ids before the load), as 'TID (name)'
    (the name a thread gave itself, /proc/PID/task/TID/comm), in order; [] when either list is unknown."""
    now = thread_ids(pid)
    if before is None or now is None:
        return []
    out = []
    for p, t in sorted(now - before):
        try:
            with open(f"/proc/{p}/task/{t}/comm") as f:
                out.append(f"{t} ({f.read().strip()})")
        except OSError:
            continue
    return out


def seccomp_filters(pid: int) -> int | None:
    """The most seccomp filters any process of `pid`'s tree runs under (/proc/PID/status "Seccomp_filters", Linux
    5.9+), or None when no status file says."""
    counts = []
    for p in tree_pids(pid):
        try:
            counts.append(int(_status_fields(p, "Seccomp_filters")["Seccomp_filters"]))
        except (KeyError, ValueError):
            continue
    return max(counts) if counts else None


def posix_timers(pid: int) -> int:
    """POSIX timers (timer_create) of the processes of `pid`'s tree (/proc/PID/timers; 0 where unreadable): a timer
    left by the import would run a native signal handler between timed calls."""
    n = 0
    for p in tree_pids(pid):
        try:
            with open(f"/proc/{p}/timers") as f:
                n += sum(line.startswith("ID:") for line in f)
        except OSError:
            continue
    return n


def caught_signals(pid: int) -> set[int] | None:
    """Signal numbers that some process of `pid`'s tree has a handler for (/proc/PID/status "SigCgt", a hex mask:
    bit n-1 for signal n), or None when no status file says: a handler the import installed before a load_inline
    solution's filter went on would run work between timed calls."""
    out, seen = set(), False
    for p in tree_pids(pid):
        try:
            mask = int(_status_fields(p, "SigCgt")["SigCgt"], 16)
        except (KeyError, ValueError):
            continue
        seen = True
        out |= {n + 1 for n in range(mask.bit_length()) if mask >> n & 1}
    return out if seen else None


def works_here() -> bool:
    """Whether the filter installs on this host (a throwaway Python process tries it once: `_probe_host`)."""
    return _probe_host()[0]


def filter_active(pid: int) -> bool | None:
    """Whether a process of `pid`'s tree runs under a seccomp filter (/proc/PID/status "Seccomp: 2"), or None when
    none of their status files says."""
    modes = [_status_fields(p, "Seccomp").get("Seccomp") for p in tree_pids(pid)]
    if "2" in modes:
        return True
    return False if any(m is not None for m in modes) else None


# ptrace(2) requests; PTRACE_SECCOMP_GET_FILTER (linux/ptrace.h) reads a task's classic BPF filter back
_PTRACE_DETACH, _PTRACE_SEIZE, _PTRACE_INTERRUPT, _PTRACE_SECCOMP_GET_FILTER = 17, 0x4206, 0x4207, 0x420C
_WALL = 0x40000000


def installed_programs(pid: int) -> tuple[list[bytes] | None, str]:
    """The newest seccomp filter program (struct sock_filter[] bytes, as `filter_program` makes them) of each
    filtered process of `pid`'s tree, read back with ptrace(PTRACE_SECCOMP_GET_FILTER, index 0): the process is
    seized, stopped for the read (microseconds; a blocked read restarts) and let go. Returns (programs, "") or
    (None, why): the read needs CAP_SYS_ADMIN, a reader under no seccomp filter of its own and a kernel with
    CONFIG_CHECKPOINT_RESTORE; why starts with "traced by" when another tracer holds the process. Never raises.
    Who uses it: the trusted side after a load, so that a filter of the solution's own that fakes the install (one
    filter, the count right) is told from the sandbox's (sandbox.reference_worker._after_load_threads)."""
    libc = ctypes.CDLL(None, use_errno=True)
    ptrace = libc.ptrace
    ptrace.restype = ctypes.c_long
    ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
    progs = []
    for p in tree_pids(pid):
        st = _status_fields(p, "Seccomp", "TracerPid")
        if st.get("Seccomp") != "2":
            continue
        if st.get("TracerPid", "0") != "0":
            return None, f"traced by process {st['TracerPid']}"
        if ptrace(_PTRACE_SEIZE, p, None, None) != 0:
            return None, f"ptrace(PTRACE_SEIZE, {p}): {os.strerror(ctypes.get_errno())}"
        resend = 0  # a signal that arrived as the process stopped is handed back on detach, not dropped
        try:
            if ptrace(_PTRACE_INTERRUPT, p, None, None) != 0:
                return None, f"ptrace(PTRACE_INTERRUPT, {p}): {os.strerror(ctypes.get_errno())}"
            try:
                _, status = os.waitpid(p, _WALL)
            except ChildProcessError:
                return None, f"process {p} is gone"
            if not os.WIFSTOPPED(status):
                return None, f"process {p} is gone"
            if status >> 16 == 0:  # a signal-delivery stop, not the interrupt's PTRACE_EVENT_STOP
                resend = os.WSTOPSIG(status)
            n = ptrace(_PTRACE_SECCOMP_GET_FILTER, p, ctypes.c_void_p(0), None)
            if n <= 0:
                return None, f"ptrace(PTRACE_SECCOMP_GET_FILTER, {p}): {os.strerror(ctypes.get_errno())}"
            buf = ctypes.create_string_buffer(8 * n)
            if ptrace(_PTRACE_SECCOMP_GET_FILTER, p, ctypes.c_void_p(0), buf) != n:
                return None, f"ptrace(PTRACE_SECCOMP_GET_FILTER, {p}): {os.strerror(ctypes.get_errno())}"
            progs.append(buf.raw)
        finally:
            ptrace(_PTRACE_DETACH, p, None, ctypes.c_void_p(resend))
    return progs, ""


def programs_readable_here() -> bool:
    """Whether this process can read a seccomp filter back (installed_programs) from a throwaway filtered Python
    process (`_probe_host`): where it can, a candidate whose filter cannot be read was made unreadable by its
    solution."""
    return _probe_host()[1]


@functools.cache
def _probe_host() -> tuple[bool, bool]:
    """(the filter installs here, this process reads it back byte for byte): one throwaway Python process installs
    the filter, reports, and waits while it is read back; the answer is cached for the life of this process."""
    import subprocess
    import sys

    # os._exit: Python's own finalisation puts signal handlers back (rt_sigaction), which the filter kills
    code = ("import os, sys; from sandbox.thread_filter import make_installer; "
            "print('thread_filter_probe:', make_installer()(), flush=True); sys.stdin.readline(); os._exit(0)")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        p = subprocess.Popen([sys.executable, "-c", code], cwd=root, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True, env={**os.environ, "PYTHONPATH": root})
    except OSError as e:
        log.warning("thread filter probe could not start: %s", e)
        return False, False
    timer = threading.Timer(60.0, p.kill)  # a probe that hangs counts as "does not work"
    timer.start()
    with p:
        try:
            said = next((line.split(":", 1)[1].strip() for line in p.stdout  # a startup hook's lines are skipped
                         if line.startswith("thread_filter_probe:")), "")
            progs, _ = installed_programs(p.pid) if said == "on" else (None, "")
            answer = said == "on", progs == [filter_program(platform.machine())]
        finally:
            timer.cancel()
            p.kill()
    log.info("thread filter on this host: installs %s, read back %s", *answer)
    return answer
