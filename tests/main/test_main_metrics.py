"""KernelBench metrics (cuda_agent.kb_metrics) against hand-computed values, and the report built from a metrics
JSONL (cuda_agent.report) with real matplotlib PNGs."""

from __future__ import annotations

import json
import math

import pytest

from cuda_agent.kb_metrics import (Sample, environment, kernelbench_metrics, markdown_table, sample_from_eval_result,
                                   sample_from_result_row)


def _samples():
    return [
        Sample("a", level=1, correct=True, speedup_eager=2.0, speedup_compile=1.5, reward=2, status="ok"),
        Sample("a", level=1, correct=False, reward=-1, status="compile_error"),
        Sample("b", level=1, correct=True, speedup_eager=0.5, speedup_compile=0.25, reward=0, status="ok"),
        Sample("b", level=1, correct=False, reward=-1, status="incorrect"),
        Sample("c", level=2, correct=True, speedup_eager=4.0, speedup_compile=None, reward=1, status="ok"),
        Sample("d", level=2, correct=False, reward=-1, status="forbidden"),
    ]


def test_rates_and_geomeans_by_hand():
    m = kernelbench_metrics(_samples())
    o = m["overall"]
    assert o["samples"] == 6 and o["tasks"] == 4
    assert o["pass_rate"] == pytest.approx(3 / 6)
    assert o["faster_than_eager"] == pytest.approx(2 / 6)  # a (2.0) and c (4.0); b is slower
    assert o["faster_than_compile"] == pytest.approx(1 / 6)  # only a; c has no compile baseline
    assert o["geomean_speedup_eager"] == pytest.approx((2.0 * 0.5 * 4.0) ** (1 / 3))
    assert o["geomean_speedup_compile"] == pytest.approx(math.sqrt(1.5 * 0.25))
    # failures (and the correct sample without a compile time) count as 1x in the "_all" variant
    assert o["geomean_speedup_compile_all"] == pytest.approx((1.5 * 0.25) ** (1 / 6))
    assert o["mean_reward"] == pytest.approx((2 - 1 + 0 - 1 + 1 - 1) / 6)
    assert o["pass_at_n"] == pytest.approx(3 / 4)
    assert o["status_counts"] == {"compile_error": 1, "forbidden": 1, "incorrect": 1, "ok": 3}
    l1, l2 = m["levels"]["1"], m["levels"]["2"]
    assert l1["pass_rate"] == pytest.approx(0.5) and l1["tasks"] == 2
    assert l2["pass_rate"] == pytest.approx(0.5) and l2["geomean_speedup_compile"] is None
    assert l2["faster_than_eager"] == pytest.approx(0.5)


def test_no_correct_sample_gives_zero_rates_and_no_geomean():
    m = kernelbench_metrics([Sample("x", correct=False, status="compile_error")] * 3)["overall"]
    assert m["pass_rate"] == 0 and m["faster_than_eager"] == 0 and m["geomean_speedup_eager"] is None
    assert m["geomean_speedup_compile_all"] == pytest.approx(1.0)
    assert m["mean_reward"] == -1


def test_bad_input_is_refused_with_a_clear_error():
    with pytest.raises(ValueError, match="no samples"):
        kernelbench_metrics([])
    with pytest.raises(ValueError, match="speedup_eager"):
        Sample("x", correct=True, speedup_eager=-2.0)
    with pytest.raises(ValueError, match="task_id"):
        Sample("", correct=True)


def test_samples_from_actor_rows_and_sandbox_results():
    row = {"task_id": "t1", "level": 2, "reward": 1.0, "status": "finished",
           "final": {"status": "ok", "reward": 1.0, "speedup_eager": 1.3, "speedup_compile": 0.9}}
    s = sample_from_result_row(row)
    assert (s.correct, s.level, s.speedup_eager, s.speedup_compile, s.reward) == (True, 2, 1.3, 0.9, 1.0)
    bad = sample_from_result_row({"task_id": "t2", "reward": -1.0, "status": "policy_error", "final": None})
    assert not bad.correct and bad.speedup_eager is None and bad.status == "policy_error"
    # an episode that never wrote model_new.py (the sandbox reports a build error for the empty workspace)
    empty = sample_from_result_row({"task_id": "t5", "reward": -1.0, "status": "finished", "files": {},
                                    "final": {"status": "compile_error", "reward": -1.0}})
    assert not empty.correct and empty.status == "no_solution"
    built = sample_from_result_row({"task_id": "t6", "reward": -1.0, "status": "finished",
                                    "files": {"model_new.py": "x"}, "final": {"status": "compile_error"}})
    assert built.status == "compile_error"
    from sandbox.result import Distribution, EvalResult, SpeedUp, TimingStats

    d = Distribution(1.0, 0.1, 0.9, 1.0, 5)
    res = EvalResult(status="ok", reward=2.0, task_id="t3", timing=TimingStats(
        device="cpu", calls_per_rep=1, warmup_calls=1, eager=d, compiled=d, candidate=d,
        speedup_eager=SpeedUp(2.5, 2.0, 3.0, 0.9), speedup_compile=SpeedUp(1.2, 1.1, 1.3, 0.9), milestone=2))
    s3 = sample_from_eval_result(res, level=1)
    assert (s3.correct, s3.speedup_eager, s3.speedup_compile, s3.level) == (True, 2.5, 1.2, 1)
    s4 = sample_from_eval_result(EvalResult.failure("incorrect", "wrong", task_id="t4").to_dict())
    assert not s4.correct and s4.speedup_eager is None and s4.reward == -1


def test_markdown_table_names_device_and_torch():
    md = markdown_table(kernelbench_metrics(_samples()), environment())
    assert "torch 2." in md and "| level 1 |" in md and "| all |" in md
    assert "50.0%" in md  # pass rate of the whole set


def _write_run(tmp_path):
    """A small run folder as the train driver writes it."""
    from cuda_agent.rundir import MetricsLog, RunDir

    run = RunDir(tmp_path / "run")
    ml = MetricsLog(run.metrics_path, run / "tb")
    ml.log("stage", "warm_start", 0, event="start")
    for i in range(5):
        ml.log("train", "warm_start", i, **{"sft/nll": 3.0 - 0.5 * i})
    ml.log("stage", "warm_start", 5, event="end", duration_s=10.0)
    rows = {"eval-after_warm_start": [
        {"task_id": "e1", "level": 2, "reward": -1.0, "status": "finished", "final": {"status": "compile_error"},
         "files": {"model_new.py": "x = 1\n"}},
        {"task_id": "e2", "level": 2, "reward": 1.0, "status": "finished",
         "final": {"status": "ok", "speedup_eager": 1.4, "speedup_compile": 0.8},
         "files": {"model_new.py": "import torch\n", "kernels/k.cpp": "extern \"C\" void k() {}\n"}}],
        "eval-after_warm_start-rollout": [
        {"task_id": "fresh_r1", "level": 2, "reward": 0.0, "status": "finished", "final": {"status": "ok"},
         "files": {"model_new.py": "import torch\n"}}]}
    for order, (tag, rs) in enumerate(rows.items()):
        split = "rollout" if tag.endswith("-rollout") else "eval"
        with open(run.episodes_path(tag), "w") as f:
            for r in rs:
                f.write(json.dumps(r) + "\n")
        m = kernelbench_metrics([sample_from_result_row(r) for r in rs])
        per_task = {r["task_id"]: {"reward": r["reward"], "status": r["final"]["status"],
                                   "speedup_eager": r["final"].get("speedup_eager")} for r in rs}
        run.eval_path(tag[5:]).write_text(json.dumps({"tag": tag[5:], "split": split, "order": order, "updates": 5,
                                                      "metrics": m, "per_task": per_task}))
        ml.log("eval", "warm_start", 5, tag=tag[5:], split=split,
               **{k: v for k, v in m["overall"].items() if not isinstance(v, dict)})
    for i in range(3):
        ml.log("rollout", "single_turn_ppo", 6 + i, reward_mean=-1.0 + 0.5 * i, pass_rate=0.1 * i, episodes=8,
               episodes_per_s=0.2)
    ml.close()
    run.write_state({"preset": "test", "status": "finished", "top_kernels": 3,
                     "stages": {"warm_start": {"status": "done", "duration_s": 10.0}}})
    return run


def test_report_from_metrics_jsonl(tmp_path):
    from cuda_agent.report import build_report

    run = _write_run(tmp_path)
    path = build_report(run.root)
    text = path.read_text()
    assert "NLL 3.000 -> 1.000" in text  # the warm start's loss, first and last step
    for name in ("reward", "pass_rate", "speedup", "loss"):
        png = run.root / "plots" / f"{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
        assert f"plots/{name}.png" in text
    assert "| after_warm_start | eval | 5 | 2 | 0.000 | 50.0% |" in text  # mean reward (-1 + 1) / 2, pass 1 of 2
    assert "| e2 | +1.0 (ok) | 1.40 |" in text  # per-task table
    # the PPO rollout tasks: their own row in the stage table and their own per-task table, after the held-out one
    assert "| after_warm_start-rollout | rollout | 5 | 1 | 0.000 | 100.0% |" in text
    rollout_part = text[text.index("## Per task (the PPO stages' rollout tasks)"):]
    assert "| fresh_r1 | +0.0 (ok) | - |" in rollout_part and "| e2 |" not in rollout_part.split("## ")[1]
    # the best episode's kernel is kept for audit, in the report and as files
    assert (run.root / "kernels" / "01-e2" / "kernels" / "k.cpp").read_text().startswith('extern "C"')
    assert text.index("1. e2") < text.index("2. fresh_r1") < text.index("3. e1")  # every split's episodes
    # TensorBoard got the scalars
    assert any(p.name.startswith("events.out.tfevents") for p in (run.root / "tb").iterdir())


def test_metrics_log_survives_a_torn_line(tmp_path):
    from cuda_agent.rundir import MetricsLog, read_metrics

    ml = MetricsLog(tmp_path / "m.jsonl")
    ml.log("train", "s", 1, loss=1.0)
    ml.close()
    with open(tmp_path / "m.jsonl", "a") as f:
        f.write('{"kind": "train", "sta')
    recs = list(read_metrics(tmp_path / "m.jsonl"))
    assert len(recs) == 1 and recs[0]["loss"] == 1.0 and recs[0]["stage"] == "s"
