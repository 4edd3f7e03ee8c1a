"""Regression cases of breaker pass 3 (tests/integrity/breaker3/<name>/: model_new.py, kernels/, NOTES.md with what
the breaker saw). Each case's model_new.py docstring names the defence that must catch it; the test asserts that
defence's violation and reward -1, with the static checks on (as the breaker ran them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from integrity_lib import cpu_config, kinds, task

HERE = Path(__file__).resolve().parent
CASES = HERE / "breaker3"

# name -> (corpus task, violation kind the result must carry; a tuple: any one of them)
EXPECTED = {
    "disguised_forward_torch_compute": ("row_softmax", "dynamic_code"),
    "disguised_baseline_saboteur": ("row_softmax", "dynamic_code"),
    "sample_time_fixup_ewchain": ("elementwise_chain", "dynamic_code"),
    "direct_guard_via_stdlib_caller": ("row_softmax", "guard_bypass"),
    "import_via_stdlib_caller": ("row_softmax", "numpy_bridge"),
    # its burner threads start in forward: the thread filter kills the process (test_native_thread_saboteur_
    # without_the_thread_filter: the CPU-time checks refuse it too)
    "native_thread_saboteur": ("elementwise_chain", "background_thread"),
    "frames_monitor_off_spin": ("elementwise_chain", "introspection"),
    "frames_via_stdlib_monitor_off": ("elementwise_chain", "introspection"),
}


@pytest.fixture(scope="module")
def evaluator(tmp_path_factory):
    from sandbox.evaluator import Evaluator

    # the training settings' 20 repetitions (the saboteur's burners need the gaps between them)
    ev = Evaluator(cpu_config(tmp_path_factory.mktemp("breaker3"), static_checks=True, reps=20))
    yield ev
    ev.close()


def test_every_case_folder_has_an_expectation():
    assert {p.name for p in CASES.iterdir() if p.is_dir()} == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_case_is_refused_with_its_violation(evaluator, name):
    from sandbox.files import load_solution

    task_name, kind = EXPECTED[name]
    files = load_solution(CASES / name)
    assert "Defence" in files["model_new.py"].split('"""')[1], f"{name}: docstring names the defence"
    res = evaluator.evaluate(task(task_name), files, "cpu")
    assert res.status == "forbidden" and res.reward == -1, f"{name}: {res.status}: {res.message}"
    allowed = kind if isinstance(kind, tuple) else (kind,)
    assert set(allowed) & set(kinds(res)), f"{name}: {res.message} {res.violations}"


def test_native_thread_saboteur_without_the_thread_filter(tmp_path):
    """The CPU-time checks on their own (SandboxConfig.thread_filter off): its burners run between requests
    (background_work); on a loaded box they also overrun into the time and sample requests, and the per-request CPU
    check (parallel_work) can fire first: either refuses it."""
    from sandbox.evaluator import Evaluator
    from sandbox.files import load_solution

    ev = Evaluator(cpu_config(tmp_path, static_checks=True, reps=20, thread_filter=False))
    try:
        res = ev.evaluate(task("elementwise_chain"), load_solution(CASES / "native_thread_saboteur"), "cpu")
    finally:
        ev.close()
    assert res.status == "forbidden" and res.reward == -1, res.message
    assert {"background_work", "parallel_work"} & set(kinds(res)), (res.message, res.violations)
