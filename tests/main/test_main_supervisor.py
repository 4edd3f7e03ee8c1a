"""The process supervisor on real OS processes: restart of a crashed child with backoff, giving up after
max_restarts, ordered stop with SIGTERM then SIGKILL, process groups, and readiness files."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from cuda_agent.supervisor import ProcessSpec, Supervisor

PY = sys.executable


def _until(cond, timeout_s=20.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0): read its state
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_a_killed_child_is_restarted_and_the_others_keep_running(tmp_path):
    events = []
    server = [PY, "-c", "import time, os; print('up', os.getpid(), flush=True); time.sleep(600)"]
    with Supervisor(tmp_path / "logs", on_event=events.append, poll_s=0.05) as sup:
        a = sup.start(ProcessSpec("actor-0", server, restart=True, backoff_s=0.1))
        b = sup.start(ProcessSpec("sandbox", server, restart=True, backoff_s=0.1))
        first_a, first_b = a.pid, b.pid
        log = tmp_path / "logs" / "actor-0.log"
        assert _until(lambda: f"up {first_a}" in log.read_text())
        sup.signal("actor-0", signal.SIGKILL)
        assert _until(lambda: sup.restarts("actor-0") == 1 and sup.state("actor-0") == "running")
        assert a.pid != first_a and _alive(a.pid)
        assert _until(lambda: f"up {a.pid}" in log.read_text())
        assert b.pid == first_b and sup.state("sandbox") == "running"  # untouched
        states = [(e.name, e.state) for e in events if e.name == "actor-0"]
        assert ("actor-0", "crashed") in states and ("actor-0", "restarting") in states
        crash = next(e for e in events if e.state == "crashed")
        assert crash.returncode == -signal.SIGKILL and "SIGKILL" in crash.message
    assert not _alive(a.pid) and not _alive(b.pid)  # close() stopped both
    text = log.read_text()
    assert text.count("start actor-0") == 2 and f"up {first_a}" in text and f"up {a.pid}" in text


def test_gives_up_after_max_restarts_with_growing_backoff(tmp_path):
    with Supervisor(tmp_path / "logs", poll_s=0.02) as sup:
        sup.start(ProcessSpec("flaky", [PY, "-c", "import sys; sys.exit(7)"], restart=True, max_restarts=2,
                              backoff_s=0.2))
        assert _until(lambda: sup.state("flaky") == "failed", 30)
        assert sup.restarts("flaky") == 2
        runs = [e.time for e in sup.events if e.name == "flaky" and e.state == "running"]
        assert len(runs) == 3
        assert runs[2] - runs[1] >= 0.35  # second wait is 2 x backoff
        assert sup.children["flaky"].returncode == 7


def test_exit_0_is_finished_not_restarted(tmp_path):
    with Supervisor(tmp_path / "logs", poll_s=0.02) as sup:
        sup.start(ProcessSpec("job", [PY, "-c", "print('done')"], restart=True))
        assert sup.wait("job", 20) == 0
        time.sleep(0.3)
        assert sup.state("job") == "finished" and sup.restarts("job") == 0


def test_an_ok_exit_code_is_finished_and_others_crash(tmp_path):
    # a stage worker's exit 4 ("nothing to train on") showed in the H200 run's report as "stage-rft crashed"
    with Supervisor(tmp_path / "logs", poll_s=0.02) as sup:
        sup.start(ProcessSpec("skip", [PY, "-c", "import sys; sys.exit(4)"], ok_exit_codes=(0, 4)))
        sup.start(ProcessSpec("bad", [PY, "-c", "import sys; sys.exit(5)"], ok_exit_codes=(0, 4)))
        assert sup.wait("skip", 20) == 4 and sup.wait("bad", 20) == 5
        _until(lambda: sup.state("bad") != "running")
        assert sup.state("skip") == "finished" and sup.state("bad") == "crashed"
        assert [e.state for e in sup.events if e.name == "skip"][-1] == "finished"


def test_stop_sends_sigterm_to_the_group_then_sigkill(tmp_path):
    # a child that starts a grandchild and ignores SIGTERM: both must be gone after stop()
    code = ("import signal, subprocess, sys, time\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
            "open(sys.argv[1], 'w').write(str(p.pid))\n"
            "time.sleep(600)\n")
    pidfile = tmp_path / "grandchild.pid"
    with Supervisor(tmp_path / "logs") as sup:
        mp = sup.start(ProcessSpec("stubborn", [PY, "-c", code, str(pidfile)], stop_timeout_s=1.0))
        assert _until(lambda: pidfile.exists() and pidfile.read_text())
        grandchild = int(pidfile.read_text())
        t0 = time.monotonic()
        rc = sup.stop("stubborn")
        assert rc == -signal.SIGKILL and 0.9 <= time.monotonic() - t0 < 10
        assert not _alive(mp.pid)
        assert _until(lambda: not _alive(grandchild), 5)
        assert sup.state("stubborn") == "stopped" and sup.restarts("stubborn") == 0


def test_stop_all_with_two_signals_cancels_at_once_and_in_parallel(tmp_path):
    # an actor finishes its running episodes on the first SIGTERM and cancels them on the second; at a stage's end
    # the supervisor sends both to every actor at once, not 5 s of grace then SIGKILL one actor after another
    # (SIGTERM, then SIGINT: two SIGTERMs sent 0.1 s apart can reach Python's handler as one)
    code = ("import signal, sys, time\n"
            "seen = []\n"
            "def on_signal(signum, _):\n"
            "    seen.append(signal.Signals(signum).name)\n"
            "    if len(seen) == 2:\n"
            "        open(sys.argv[1], 'w').write(','.join(seen)); sys.exit(0)\n"
            "signal.signal(signal.SIGTERM, on_signal)\n"
            "signal.signal(signal.SIGINT, on_signal)\n"
            "open(sys.argv[1] + '.up', 'w').write('up')\n"
            "while True: time.sleep(0.01)\n")
    outs = [tmp_path / f"a{i}" for i in range(3)]
    with Supervisor(tmp_path / "logs") as sup:
        for i, out in enumerate(outs):
            sup.start(ProcessSpec(f"actor-{i}", [PY, "-c", code, str(out)], stop_timeout_s=5.0))
        assert _until(lambda: all(out.with_name(out.name + ".up").exists() for out in outs))
        t0 = time.monotonic()
        sup.stop_all([f"actor-{i}" for i in range(3)], signals=2)
        took = time.monotonic() - t0
        # each exited on its own, after its 2nd signal
        # (both pending at once, e.g. on a loaded box, Python runs SIGINT's handler first: the order is not the point)
        assert all(sorted(out.read_text().split(",")) == ["SIGINT", "SIGTERM"] for out in outs), \
            [o.read_text() for o in outs]
        assert all(sup.children[f"actor-{i}"].returncode == 0 for i in range(3))
        assert took < 5.0  # no actor waited out its 5 s grace


def test_graceful_child_stops_on_sigterm_and_is_not_restarted(tmp_path):
    code = ("import signal, sys, time\n"
            "def bye(*_):\n"
            "    open(sys.argv[1], 'w').write('checkpoint written'); sys.exit(0)\n"
            "signal.signal(signal.SIGTERM, bye)\n"
            "open(sys.argv[2], 'w').write('{\"port\": 1234}')\n"
            "time.sleep(600)\n")
    marker, ready = tmp_path / "ckpt", tmp_path / "ready.json"
    with Supervisor(tmp_path / "logs") as sup:
        sup.start(ProcessSpec("learner", [PY, "-c", code, str(marker), str(ready)], restart=True,
                              ready_file=str(ready)))
        sup.wait_ready("learner", 20)
        assert sup.ready_info("learner") == {"port": 1234}
        assert sup.stop("learner") == 0
        assert marker.read_text() == "checkpoint written"
        time.sleep(0.3)
        assert sup.state("learner") == "stopped" and sup.restarts("learner") == 0


def test_wait_ready_reports_a_child_that_dies_first(tmp_path):
    with Supervisor(tmp_path / "logs", poll_s=0.02) as sup:
        sup.start(ProcessSpec("bad", [PY, "-c", "import sys; print('no GPU here'); sys.exit(2)"],
                              ready_file=str(tmp_path / "never")))
        with pytest.raises(RuntimeError, match="no GPU here"):
            sup.wait_ready("bad", 20)


def test_spec_validation():
    with pytest.raises(ValueError, match="argv"):
        ProcessSpec("x", [])
    with pytest.raises(ValueError, match="name"):
        ProcessSpec("a/b", ["true"])
