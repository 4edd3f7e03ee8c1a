"""sandbox.thread_filter on real processes: the seccomp filter kills a process that starts a thread or a process
after it is installed, and threads from before run on; the trusted side's /proc look finds threads started after a
snapshot."""

from __future__ import annotations

import os
import platform
import signal
import subprocess
import sys

import pytest

from sandbox import thread_filter

pytestmark = pytest.mark.skipif(platform.machine() not in ("x86_64", "aarch64") or sys.platform != "linux",
                                reason="the thread filter is for Linux on x86_64 / aarch64")

_CHILD = r"""
import os, subprocess, sys, threading
from sandbox.thread_filter import make_installer
print(subprocess.run([sys.executable, "-c", "print('child process ok')"], capture_output=True, text=True).stdout.strip(), flush=True)
early = threading.Event()
def waiter():
    early.wait()
    print("early thread ran on", flush=True)
t = threading.Thread(target=waiter)
t.start()                       # started before the filter: it keeps running under it (TSYNC)
install = make_installer()
print(install(), flush=True)
early.set(); t.join()
mode = sys.argv[1]
if mode == "thread":
    threading.Thread(target=lambda: print("new thread ran", flush=True)).start()
elif mode == "fork":
    if os.fork() == 0:
        os._exit(0)
elif mode == "spawn":
    subprocess.run([sys.executable, "-c", "pass"])
elif mode == "sigaction":
    import signal
    signal.signal(signal.SIGUSR1, lambda *a: None)
elif mode in ("query", "sigabrt_reset", "abort"):
    import ctypes, signal
    libc = ctypes.CDLL(None, use_errno=True)
    libc.sigaction.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
    act = ctypes.create_string_buffer(512)  # zeroed: SIG_DFL, no flags; larger than any struct sigaction
    if mode == "query":
        print("query", libc.sigaction(signal.SIGUSR1, None, act), signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL, flush=True)
    elif mode == "sigabrt_reset":
        print("reset", libc.sigaction(signal.SIGABRT, act, None), ctypes.get_errno(), flush=True)
    else:
        libc.abort()
elif mode == "setitimer":
    import signal
    signal.setitimer(signal.ITIMER_REAL, 100.0)
elif mode == "timer_create":
    import ctypes
    timer = ctypes.c_void_p()
    ctypes.CDLL(None).timer_create(1, None, ctypes.byref(timer))  # CLOCK_MONOTONIC, SIGEV_SIGNAL SIGALRM
print("end", flush=True)
os._exit(0)  # Python's finalisation puts signal handlers back (rt_sigaction): the filter would kill it
"""


def _child(mode: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _CHILD, mode], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("mode", ["thread", "fork", "spawn", "sigaction", "setitimer", "timer_create"])
def test_a_thread_process_or_timer_started_under_the_filter_kills_the_process(mode):
    """Threads and processes, signal handlers and the timers that would run one between calls."""
    r = _child(mode)
    assert r.returncode == -signal.SIGSYS, (r.returncode, r.stdout, r.stderr)
    assert r.stdout.split("\n")[:3] == ["child process ok", "on", "early thread ran on"], r.stdout
    assert "new thread ran" not in r.stdout and "end" not in r.stdout


@pytest.mark.parametrize("mode", ["query", "sigabrt_reset"])
def test_signal_queries_and_sigabrt_reset_do_not_kill(mode):
    """A query (act NULL) answers; setting SIGABRT's disposition, glibc abort()'s reset, fails with EPERM."""
    r = _child(mode)
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
    line = r.stdout.split("\n")[3]
    assert line == ("query 0 True" if mode == "query" else "reset -1 1"), r.stdout


def test_abort_under_the_filter_is_a_crash_not_a_filter_kill():
    """An honest abort() dies by SIGABRT (in the jail's PID 1, whose first raise is ignored, by the SIGSEGV of
    abort's last resort: the CPU corpus's layer_norm/crash covers that end to end), never by SIGSYS."""
    r = _child("abort")
    assert r.returncode == -signal.SIGABRT, (r.returncode, r.stdout, r.stderr)


def test_threads_from_before_run_on_under_the_filter():
    r = _child("none")
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
    assert r.stdout.split("\n")[:4] == ["child process ok", "on", "early thread ran on", "end"]


def test_filter_program_per_machine():
    x86, arm = thread_filter.filter_program("x86_64"), thread_filter.filter_program("aarch64")
    assert len(x86) % 8 == 0 and len(arm) % 8 == 0 and x86 != arm  # other syscall numbers and arch
    with pytest.raises(ValueError, match="riscv64"):
        thread_filter.filter_program("riscv64")


_WAITER = r"""
import sys, threading, time
print("ready", flush=True)
sys.stdin.readline()
ev = threading.Event()
t = threading.Thread(target=ev.wait, name="helper")
t.start()
print("started", flush=True)
sys.stdin.readline()
if sys.argv[1] == "filter":
    from sandbox.thread_filter import make_installer
    print(make_installer()(), flush=True)
    sys.stdin.readline()
ev.set()
t.join()
import os
os._exit(0)  # Python's finalisation puts signal handlers back (rt_sigaction): the filter would kill it
"""


@pytest.mark.parametrize("mode", ["plain", "filter"])
def test_new_threads_and_filter_active_seen_from_outside(mode):
    p = subprocess.Popen([sys.executable, "-c", _WAITER, mode], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        before = thread_filter.thread_ids(p.pid)
        assert before and all(pid == p.pid for pid, _ in before)
        assert thread_filter.new_threads(p.pid, before) == []
        assert thread_filter.filter_active(p.pid) is False
        p.stdin.write("\n")
        p.stdin.flush()
        assert p.stdout.readline().strip() == "started"
        new = thread_filter.new_threads(p.pid, before)
        assert len(new) == 1 and new[0].split(" ")[0].isdigit(), new  # "TID (comm)"
        n0 = thread_filter.seccomp_filters(p.pid)  # None on kernels before 5.9
        assert n0 in (None, 0) and thread_filter.posix_timers(p.pid) == 0
        if mode == "filter":
            p.stdin.write("\n")
            p.stdin.flush()
            assert p.stdout.readline().strip() == "on"
            assert thread_filter.filter_active(p.pid) is True
            assert thread_filter.seccomp_filters(p.pid) == (None if n0 is None else 1)
        p.stdin.write("\n\n")
        p.stdin.flush()
        assert p.wait(timeout=30) == 0
    finally:
        p.kill()
        p.wait()
    assert thread_filter.thread_ids(p.pid) is None and thread_filter.filter_active(p.pid) is None


def test_the_filter_goes_on_before_the_import_unless_the_load_builds(tmp_path):
    """CandidateProcess.setup's choice: before the import for every format whose build the sandbox made (cpu, cubin,
    the extension format's workspace layout: its manifest lists an extension module), after the load for a
    load_inline solution (it builds in its own load)."""
    import json

    from sandbox.reference_worker import _has_extension_module

    built = tmp_path / "built.json"
    built.write_text(json.dumps({"artifacts": [{"kind": "ext", "path": "/x.so", "module_name": "m"}]}))
    inline = tmp_path / "inline.json"
    inline.write_text(json.dumps({"artifacts": []}))
    assert _has_extension_module(str(built)) is True
    assert _has_extension_module(str(inline)) is False
    assert _has_extension_module(None) is False and _has_extension_module(str(tmp_path / "missing.json")) is False


@pytest.mark.parametrize("device,flags,asked", [
    ("cpu", {}, True), ("cpu", {"cpu_threads": 2}, False), ("cpu", {"thread_filter": False}, False),
    ("cuda", {}, True), ("cuda", {"cpu_threads": 2}, False), ("cuda", {"thread_filter_cuda": False}, False),
    ("cuda", {"thread_filter": False}, True)])
def test_which_candidates_ask_for_the_filter(tmp_path, device, flags, asked):
    """CandidateProcess.thread_filter: the CPU backend's flag (thread_filter) or the CUDA backend's
    (thread_filter_cuda, on by default), and on both only with one intra-op thread (torch's own pool would start
    threads after the import). The process is killed at once: only the choice is looked at."""
    from sandbox.config import SandboxConfig
    from sandbox.reference_worker import CandidateProcess

    cfg = SandboxConfig(backend="cuda" if device == "cuda" else "cpu", work_root=str(tmp_path), **flags)
    cand = CandidateProcess(device, cfg, namespaces=False)
    try:
        assert cand.thread_filter is asked
    finally:
        cand.kill()


def test_works_here():
    assert thread_filter.works_here() is True


def test_caught_signals_sees_a_handler_installed_later():
    """caught_signals reads SigCgt of the tree: a handler installed after a snapshot shows up as its number."""
    code = ("import signal, sys\nprint('ready', flush=True)\nsys.stdin.readline()\n"
            "signal.signal(signal.SIGUSR2, lambda *a: None)\nprint('installed', flush=True)\nsys.stdin.readline()\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        before = thread_filter.caught_signals(p.pid)
        assert before is not None and signal.SIGUSR2 not in before, before  # SIGINT: only where not ignored
        p.stdin.write("\n")
        p.stdin.flush()
        assert p.stdout.readline().strip() == "installed"
        assert thread_filter.caught_signals(p.pid) - before == {signal.SIGUSR2}
        p.stdin.write("\n")
        p.stdin.flush()
        assert p.wait(timeout=30) == 0
    finally:
        p.kill()
        p.wait()
    assert thread_filter.caught_signals(p.pid) is None


_FILTERED = r"""
import ctypes, os, struct, sys
from sandbox.thread_filter import make_installer
mode = sys.argv[1]
if mode == "traced":
    ctypes.CDLL(None).ptrace(0, 0, None, None)  # PTRACE_TRACEME: the parent, this test, becomes the tracer
if mode == "own":  # a filter of its own that allows everything (one BPF_RET ALLOW), not the sandbox's
    prog = ctypes.create_string_buffer(struct.pack("=HBBI", 0x06, 0, 0, 0x7FFF0000))
    class F(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
    libc = ctypes.CDLL(None)
    libc.prctl(38, 1, 0, 0, 0)
    print("on" if libc.syscall(317, 1, 0, ctypes.byref(F(1, ctypes.addressof(prog)))) == 0 else "off", flush=True)
elif mode != "none":
    print(make_installer()(), flush=True)
else:
    print("on", flush=True)
sys.stdin.readline()
os._exit(0)
"""


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the test's own filter uses x86_64's seccomp number")
@pytest.mark.parametrize("mode", ["sandbox", "own", "traced", "none"])
def test_installed_programs_reads_the_filter_back(mode):
    """The trusted side's read of a candidate's filter (ptrace PTRACE_SECCOMP_GET_FILTER): the sandbox's program
    byte for byte, another program for a filter of the process's own, no answer for a process another tracer
    holds, nothing for an unfiltered one."""
    if not thread_filter.programs_readable_here():
        pytest.skip("seccomp filters cannot be read back here (needs root and no seccomp filter on this process)")
    p = subprocess.Popen([sys.executable, "-c", _FILTERED, mode], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True)
    try:
        assert p.stdout.readline().strip() == "on"
        progs, why = thread_filter.installed_programs(p.pid)
        if mode == "sandbox":
            assert progs == [thread_filter.filter_program("x86_64")] and why == ""
        elif mode == "own":
            assert progs is not None and len(progs) == 1 and progs[0] != thread_filter.filter_program("x86_64")
            assert len(progs[0]) == 8
        elif mode == "traced":
            assert progs is None and why == f"traced by process {os.getpid()}", why
        else:
            assert progs == [] and why == ""
        p.stdin.write("\n")
        p.stdin.flush()
        if mode != "traced":  # a tracee that gets no ptrace handling from its tracer may stop on its way out
            assert p.wait(timeout=30) == 0  # the read let it go: it runs on and exits normally
    finally:
        p.kill()
        p.wait()
