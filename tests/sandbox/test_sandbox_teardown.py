"""A used candidate's process tree is gone before the next evaluation times anything.

The trusted worker kills a candidate at the end of its evaluation without waiting (off the reply's path), and the
next evaluation's first timed section waits for the end of the old candidate's reply pipe: every process holding
its write end has exited, and with it released its memory. Real processes throughout.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from sandbox.config import SandboxConfig
from sandbox.reference_worker import WorkerPool, wait_for_eof


def _writer(seconds: float) -> tuple[subprocess.Popen, int]:
    """A child that holds the write end of a fresh pipe for `seconds`, writing a little first; the read end."""
    r, w = os.pipe()
    p = subprocess.Popen([sys.executable, "-c", f"import os, time; os.write({w}, b'x' * 100); time.sleep({seconds})"],
                         pass_fds=(w,))
    os.close(w)
    return p, r


def test_wait_for_eof_returns_when_the_writer_exits_and_drains_what_it_wrote():
    p, r = _writer(0.4)
    t0 = time.monotonic()
    left = wait_for_eof([r], 10.0)
    waited = time.monotonic() - t0
    assert left == [], left
    assert p.wait(timeout=5) == 0
    assert waited >= 0.2, waited  # it waited for the exit, not only for the bytes
    with pytest.raises(OSError):
        os.fstat(r)  # closed at its EOF


def test_wait_for_eof_gives_up_at_the_deadline_and_leaves_the_pipe_open():
    p, r = _writer(60)
    try:
        t0 = time.monotonic()
        left = wait_for_eof([r], 0.3)
        assert left == [r]
        assert 0.25 <= time.monotonic() - t0 < 5.0
        os.fstat(r)  # still open: the caller decides
    finally:
        p.kill()
        p.wait()
    assert wait_for_eof([r], 5.0) == []


@pytest.mark.parametrize("use_zygote", [True, False])
def test_a_retired_candidate_is_gone_after_await_teardown(use_zygote):
    """Zygote-forked candidates are not our children (no waitpid): the pipe's EOF is what shows them gone."""
    pool = WorkerPool(SandboxConfig(backend="cpu"), use_zygote=use_zygote)
    try:
        cand = pool.take("cpu", False)
        pid = cand.pid
        os.kill(pid, 0)  # alive
        pool.retire(cand)
        assert len(pool.dying) == 1
        waited_ms, alive = pool.await_teardown(10.0)
        assert alive == 0 and pool.dying == []
        assert waited_ms >= 0.0
        # the pipe closes in the kernel's do_exit after the memory is released and just before the process is
        # released itself: the pid disappears a moment later
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.01)
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
        assert pool.await_teardown(10.0) == (0.0, 0)  # nothing left to wait for
    finally:
        pool.close()


def test_wait_for_eof_takes_fds_past_fd_setsize():
    """A busy node holds many fds; select.select refuses any past 1024 (the wait uses poll)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2100:
        pytest.skip(f"RLIMIT_NOFILE hard limit {hard}")
    if soft < 2100:
        resource.setrlimit(resource.RLIMIT_NOFILE, (2100, hard))
    p, r = _writer(0.2)
    high = os.dup2(r, 2000)
    os.close(r)
    try:
        assert wait_for_eof([high], 10.0) == []
    finally:
        p.wait(timeout=5)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_retired_pipes_that_never_close_are_bounded():
    """Trees that keep their reply pipe open for good (evaluations without a profile never wait for them) are let
    go oldest first once DYING_MAX are held: no fd pile-up."""
    from sandbox.reference_worker import DYING_MAX

    pool = WorkerPool(SandboxConfig(backend="cpu"), use_zygote=True)
    writers = []
    try:
        for _ in range(DYING_MAX + 3):
            r, w = os.pipe()
            writers.append(w)
            pool.dying.append(r)
        first = pool.dying[0]
        cand = pool.take("cpu", False)
        pool.retire(cand)
        assert len(pool.dying) == DYING_MAX
        with pytest.raises(OSError):
            os.fstat(first)  # the oldest was closed
    finally:
        pool.close()
        for w in writers:
            os.close(w)
