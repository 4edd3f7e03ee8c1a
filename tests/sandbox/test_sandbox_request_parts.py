"""The profile log's breakdown of a time request (reference_worker.request_parts / parts_summary): a diagnostic,
checked here on hand-made replies against the arithmetic its docstring states."""

import math

from sandbox.reference_worker import parts_summary, request_parts


def test_request_parts_splits_the_wall_clock_and_the_between_calls_work_per_call():
    reply = {"handler_ms": 5.0, "run_ms": 3.0, "loop_ms": 1.8, "prep_ms": 1.0, "integrity_ms": 0.4,
             "between_ms": {"l2_reset": 0.06, "flush": 0.6, "setup": 0.03, "after": 0.3, "copies": 0.12,
                            "drop_rep": 0.2}}
    p = request_parts(reply, wall_ms=6.5, rtt_ms=0.5, calls=3)
    assert math.isclose(p["pipe"], 1.0) and math.isclose(p["checks"], 1.0) and p["prep"] == 1.0
    assert math.isclose(p["between_per_call"], 0.4) and math.isclose(p["loop_per_call"], 0.6)
    assert p["integrity"] == 0.4 and p["drop_rep"] == 0.2  # per request
    assert math.isclose(p["flush_per_call"], 0.2) and math.isclose(p["after_per_call"], 0.1)
    assert math.isclose(p["copies_per_call"], 0.04) and math.isclose(p["l2_reset_per_call"], 0.02)


def test_request_parts_without_the_finer_parts_and_with_bad_values():
    p = request_parts({"handler_ms": 2.0, "run_ms": 1.0, "loop_ms": 0.5, "prep_ms": 0.1,
                       "between_ms": {"flush": "x", "after": float("inf")}}, 3.0, 0.5, 1)
    assert set(p) == {"pipe", "checks", "prep", "between_per_call", "loop_per_call"}


def test_parts_summary_takes_the_median_of_each_key_over_the_requests_that_have_it():
    parts = [{"pipe": 1.0, "flush_per_call": 0.2}, {"pipe": 3.0}, {"pipe": 2.0, "flush_per_call": float("nan")}]
    assert parts_summary(parts) == "pipe 2.000 ms, flush_per_call 0.200 ms"
    assert parts_summary([{"pipe": float("nan")}]) == "pipe -"


def test_request_parts_splits_the_pipe_by_direction_on_the_shared_monotonic_clock():
    """With the wall clock's start (sent_s) and the reply's t_recv / t_send, the pipe is split into the request's
    way there and the reply's way back; the two add up to the pipe."""
    reply = {"handler_ms": 5.0, "run_ms": 3.0, "loop_ms": 1.8, "prep_ms": 1.0, "t_recv": 100.0004, "t_send": 100.0054}
    p = request_parts(reply, wall_ms=6.0, rtt_ms=0.25, calls=3, sent_s=100.0)
    assert math.isclose(p["pipe_request"], 0.4, abs_tol=1e-6) and math.isclose(p["pipe_reply"], 0.6, abs_tol=1e-6)
    # the pipe has the round trip taken off, the two ways are raw
    assert math.isclose(p["pipe_request"] + p["pipe_reply"], p["pipe"] + 0.25, abs_tol=1e-6)
    assert "pipe_request" not in request_parts(reply, 6.0, 0.0, 3)  # no start given: no split


def test_a_real_profile_logs_the_parts_of_its_time_requests(tmp_path):
    """An evaluation on the CPU backend: the candidate harness's replies carry the parts (integrity checks, the
    pipe's two ways, the copies), and the profile log names them for the calibration and the time requests."""
    from sandbox.evaluator import Evaluator
    from sandbox.files import load_solution, load_task
    from sandbox_testlib import CORPUS, cpu_config

    task = CORPUS / "elementwise_chain"
    with Evaluator(cpu_config(tmp_path, use_compile=False, reps=3, early_stop_reps=0)) as ev:
        r = ev.evaluate(load_task(task), load_solution(task / "cpu" / "fast"), "cpu")
    assert r.status == "ok", (r.status, r.message)
    lines = [x for x in r.log if "the harness's own report" in x]
    assert any(x.startswith("profile: calibration (") for x in lines), r.log
    timed = [x for x in lines if x.startswith("profile: candidate time requests")]
    assert timed, r.log
    import re

    for key in ("pipe_request", "pipe_reply", "integrity", "drop_rep", "copies_per_call"):
        m = re.search(rf" {key} ([\d.]+) ms", timed[0])
        assert m, (key, timed[0])
        # milliseconds, not seconds or microseconds: each part is well under the request's 100 ms bound and the
        # integrity checks (about 0.3-1 ms on this box) are not reported as 0.000x
        assert float(m.group(1)) < 100.0, (key, timed[0])
        if key == "integrity":
            assert float(m.group(1)) > 0.01, timed[0]
