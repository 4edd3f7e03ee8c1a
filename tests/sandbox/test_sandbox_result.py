import msgpack
import pytest

from sandbox.result import (Distribution, EvalResult, SpeedUp, Status, TimingStats, TrialResult, Violation)


def _full() -> EvalResult:
    d = Distribution(1.0, 0.1, 0.9, 1.02, 3, [1.0, 0.9, 1.1])
    t = TimingStats("cpu", 2, 1, d, d, d, SpeedUp(1.0, 0.9, 1.1, 0.9), SpeedUp(1.1, 1.0, 1.2, 0.9), [1.2], "interleaved",
                    0, "why")
    return EvalResult(status=Status.OK, reward=0.0, message="m", task_id="t", format="cpu", backend="cpu",
                      stage_ms={"build": 1.5}, compile_log="log", build_cached=True,
                      trials=[TrialResult(0, True, 0.001, 0.002, 0, 10, "")], timing=t,
                      violations=[Violation("import", "numpy")], isolation={"mode": "namespaces"},
                      nvml=[{"sm_clock_mhz": 1980}], log=["note"])


def test_round_trip_through_msgpack():
    r = _full()
    d = msgpack.unpackb(msgpack.packb(r.to_dict()))
    assert EvalResult.from_dict(d) == r
    assert r.status == "ok" and r.ok and r.speedup_eager == 1.0 and r.speedup_compile == 1.1


def test_bad_records_are_rejected_with_the_field_named():
    d = _full().to_dict()
    with pytest.raises(ValueError, match="unknown field"):
        EvalResult.from_dict({**d, "surprise": 1})
    d2 = dict(d)
    del d2["status"]
    with pytest.raises(ValueError, match="status"):
        EvalResult.from_dict(d2)
    with pytest.raises(ValueError, match="status must be one of"):
        EvalResult(status="great", reward=3.0)


def test_failure_has_reward_minus_one():
    r = EvalResult.failure(Status.TIMEOUT, "slow")
    assert r.reward == -1.0 and r.status == "timeout" and not r.ok
