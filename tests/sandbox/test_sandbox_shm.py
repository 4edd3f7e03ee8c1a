"""The input segment (sandbox.shm) and the trusted worker's input thread (reference_worker.Prefetch): what the
candidate gets is read-only to it, records stay inside the segment, and no background work overlaps a timed
region."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch

from sandbox import shm, wire
from sandbox.reference_worker import Prefetch


def _segment(nbytes: int = 1 << 20) -> shm.InputSegment:
    fd = shm.create_fd()
    if fd is None:
        pytest.skip("no memfd_create here")
    seg = shm.InputSegment(fd)
    seg.size(nbytes)
    return seg


def test_round_trip_keeps_structure_and_values():
    seg = _segment()
    value = [torch.randn(3, 5), (torch.arange(7, dtype=torch.int64), torch.tensor([True, False])), 4, 2.5,
             torch.empty(0, 3)]
    rec = seg.encode(value)
    assert rec is not None
    view = shm.InputMapping(os.dup(seg.fd), seg.nbytes)
    got = wire.decode_value(rec, None, view)
    assert torch.equal(got[0], value[0]) and isinstance(got[1], tuple)
    assert torch.equal(got[1][0], value[1][0]) and torch.equal(got[1][1], value[1][1])
    assert got[2] == 4 and got[3] == 2.5 and got[4].shape == (0, 3)
    assert view.owns(got[0]) and not view.owns(value[0])
    seg.close()


def test_a_value_that_does_not_fit_goes_through_the_wire():
    seg = _segment(4096)
    assert seg.encode([torch.zeros(2048)]) is None  # 8 KiB
    assert seg.encode([torch.zeros(16)]) is not None
    seg.close()


def test_records_outside_the_segment_are_refused():
    seg = _segment(8192)
    view = shm.InputMapping(os.dup(seg.fd), seg.nbytes)
    for rec in ({"__tensor__": 1, "dtype": "float32", "shape": [4096], "shm": 0},  # 16 KiB > 8 KiB
                {"__tensor__": 1, "dtype": "float32", "shape": [4], "shm": 12},   # unaligned
                {"__tensor__": 1, "dtype": "float32", "shape": [4], "shm": -4096},
                {"__tensor__": 1, "dtype": "object", "shape": [4], "shm": 0}):
        with pytest.raises(ValueError):
            view.tensor(rec)
    with pytest.raises(ValueError):
        wire.decode_value({"__tensor__": 1, "dtype": "float32", "shape": [4], "shm": 0})  # no segment here
    seg.close()


def test_planned_record_precedes_the_bytes():
    seg = _segment()
    x = torch.randn(64)
    rec, write = seg.plan([x])
    view = shm.InputMapping(os.dup(seg.fd), seg.nbytes)
    t = wire.decode_value(rec, None, view)[0]  # a view made before the bytes are there reads nothing
    write()
    assert torch.equal(t, x)
    seg.close()


_CHILD = textwrap.dedent("""
    import mmap, os, sys
    fd = int(sys.argv[1])
    what = sys.argv[2]
    if what == "write":
        try:
            os.pwrite(fd, b"x", 0)
        except PermissionError:
            sys.exit(10)
    elif what == "mmap_rw":
        try:
            mmap.mmap(fd, 4096, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except PermissionError:
            sys.exit(10)
    elif what == "truncate":
        try:
            os.ftruncate(fd, 1 << 30)
        except PermissionError:
            sys.exit(10)
    elif what == "reopen_write":
        fd2 = os.open(f"/proc/self/fd/{fd}", os.O_RDWR)
        try:
            os.pwrite(fd2, b"x", 0)
        except PermissionError:
            sys.exit(10)
    elif what == "tensor_write":
        import torch
        from sandbox.shm import InputMapping
        view = InputMapping(fd, int(sys.argv[3]))
        t = view.tensor({"__tensor__": 1, "dtype": "float32", "shape": [16], "shm": 0})
        t.add_(1.0)  # read-only memory: the process dies here
    sys.exit(0)
""")


@pytest.mark.parametrize("what", ["write", "mmap_rw", "truncate", "reopen_write", "tensor_write"])
def test_the_candidate_cannot_write_the_segment(what):
    seg = _segment()
    if not seg.sealed_write:
        pytest.skip("kernel without F_SEAL_FUTURE_WRITE")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    p = subprocess.run([sys.executable, "-c", _CHILD, str(seg.fd), what, str(seg.nbytes)], pass_fds=(seg.fd,),
                       env=env, capture_output=True, timeout=120)
    if what == "tensor_write":
        assert p.returncode == -signal.SIGSEGV, p.stderr.decode()[-500:]
    else:
        assert p.returncode == 10, (p.returncode, p.stderr.decode()[-500:])
    seg.close()


def test_no_background_job_overlaps_a_quiet_region():
    pf = Prefetch(False, "cpu")
    spans: list[tuple[float, float]] = []

    def job() -> None:
        t0 = time.perf_counter()
        time.sleep(0.02)
        spans.append((t0, time.perf_counter()))

    futures = [pf.submit(job) for _ in range(12)]
    quiet: list[tuple[float, float]] = []
    for _ in range(3):
        time.sleep(0.015)
        with pf.quiet():
            q0 = time.perf_counter()
            time.sleep(0.03)
            quiet.append((q0, time.perf_counter()))
    for f in futures:
        f.result(timeout=10)
    pf.cancel()
    assert len(spans) == 12
    for a, b in spans:
        for q0, q1 in quiet:
            assert b <= q0 or a >= q1, (a, b, q0, q1)


def test_cancel_ends_the_thread_even_while_quiet():
    pf = Prefetch(False, "cpu")
    started = threading.Event()
    pf.submit(started.set)
    started.wait(5)
    pf.pause()
    for _ in range(5):
        pf.submit(time.sleep, 0.01)
    pf.cancel()  # must not hang on the job held at the gate
    assert not [t for t in threading.enumerate() if t.name.startswith("sandbox-inputs")]
