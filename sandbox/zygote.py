"""A fork server for candidate workers: torch imported once, each candidate forked from it in milliseconds.

Starting a fresh Python and importing torch costs 2-10 s (more on a loaded host); an evaluation's own work is
often less. The zygote is trusted code: it imports torch and pays the first dispatch-mode cost
(`sandbox.candidate.preload`) while single-threaded, then, for each request, forks:

  zygote ──fork──> intermediate (setsid; with namespaces: unshare(pid, net, mount))
                        └──fork──> candidate (pid 1 of the new pid namespace; fresh /proc) -> sandbox.candidate.serve
The intermediate waits for the candidate and then writes one framed message `{"__exit__": status}` to the
candidate's reply pipe (status: exit code, or -signal), so the trusted side learns how the candidate died
(SIGSEGV, a sticky CUDA error's abort, ...). Killing the intermediate's process group kills both, and the
candidate's namespace with every process in it (setsid escapes included). Every process of the chain dies with
its parent (PR_SET_PDEATHSIG), so nothing outlives the trusted worker.

Protocol on the control socket (AF_UNIX stream): the trusted side sends b"spawn" with three or four fds (the pipe
end the candidate reads requests from, the pipe end it writes replies to, its log file, and optionally the memfd of
its input segment, sandbox.shm) in SCM_RIGHTS; the zygote
answers with the intermediate's pid as ASCII digits and a newline. The zygote is started with
`python -m sandbox.zygote --ctl FD --device D --threads T --namespaces 0|1`.

Fork safety: torch must not have started threads before the fork. The zygote checks /proc/self/task before
each fork and answers b"-1" (the trusted side then starts a worker the slow way) if it has more than one.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import socket
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REC, _MS_PRIVATE = 2, 4, 8, 16384, 1 << 18


def _libc() -> ctypes.CDLL:
    lib = ctypes.CDLL(None, use_errno=True)
    lib.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    lib.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    return lib


def _die_with_parent(lib: ctypes.CDLL) -> None:
    lib.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() == 1:  # the parent is already gone
        os._exit(1)


def _single_threaded() -> bool:
    try:
        return len(os.listdir("/proc/self/task")) == 1
    except OSError:
        return False


def _candidate(lib: ctypes.CDLL, fd_in: int, fd_out: int, log_fd: int, device: str, threads: int,
               namespaces: bool, shm_fd: int | None = None) -> None:
    _die_with_parent(lib)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    if namespaces:
        # pid 1 of a fresh pid namespace: a /proc that shows only this namespace
        if lib.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None) != 0 or \
                lib.mount(b"proc", b"/proc", b"proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, None) != 0:
            os.write(2, f"zygote: mounting /proc failed: {os.strerror(ctypes.get_errno())}\n".encode())
            os._exit(125)
    from sandbox.candidate import serve

    serve(fd_in, fd_out, device, threads, shm_fd)
    os._exit(0)


def _intermediate(lib: ctypes.CDLL, fds: list[int], device: str, threads: int, namespaces: bool) -> None:
    fd_in, fd_out, log_fd = fds[:3]
    shm_fd = fds[3] if len(fds) > 3 else None
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.setsid()
    _die_with_parent(lib)
    if namespaces and lib.unshare(CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET) != 0:
        os.write(log_fd, f"zygote: unshare failed: {os.strerror(ctypes.get_errno())}\n".encode())
        os._exit(125)
    pid = os.fork()
    if pid == 0:
        try:
            _candidate(lib, fd_in, fd_out, log_fd, device, threads, namespaces, shm_fd)
        finally:
            os._exit(1)
    os.close(fd_in)
    os.close(log_fd)
    if shm_fd is not None:
        os.close(shm_fd)
    _, status = os.waitpid(pid, 0)
    code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    try:
        from sandbox import wire

        os.set_blocking(fd_out, False)
        wire.send(fd_out, {"__exit__": code}, timeout_s=1.0)
    except Exception:  # noqa: BLE001 - the reader is gone or the pipe is full: EOF tells it enough
        pass
    os._exit(0)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ctl", type=int, required=True)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--namespaces", type=int, default=0)
    a = ap.parse_args(argv)
    lib = _libc()
    _die_with_parent(lib)
    from sandbox.candidate import preload

    preload(a.threads)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # intermediates are reaped automatically
    ctl = socket.socket(fileno=a.ctl)
    ctl.sendall(b"ready\n")
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(ctl, 64, 4)
        except OSError:
            os._exit(0)
        if not msg:
            os._exit(0)
        if msg != b"spawn" or len(fds) not in (3, 4) or not _single_threaded():
            for fd in fds:
                os.close(fd)
            ctl.sendall(b"-1\n")
            continue
        pid = os.fork()
        if pid == 0:
            ctl.close()
            try:
                _intermediate(lib, fds, a.device, a.threads, bool(a.namespaces))
            finally:
                os._exit(1)
        for fd in fds:
            os.close(fd)
        ctl.sendall(f"{pid}\n".encode())


if __name__ == "__main__":
    sys.exit(main())
