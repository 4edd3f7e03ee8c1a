"""Every hack class with a CPU form: an adversarial solution per class (tests/integrity/solutions/<name>.py, its
docstring says what it tries and which defence must catch it), evaluated with the static checks off so that the
runtime defences are what catches it. Each test asserts the named violation and reward -1."""

from pathlib import Path

import pytest

from integrity_lib import adversarial, kinds, task

# name -> (status, violation kind that must be among the result's violations)
FORBIDDEN = {
    "torch_compute": "dispatch_op",
    "try_except_fallback": "dispatch_op",
    "call_reference": "import",
    "explicit_dunder_import": "import",
    "inherit_reference_exec": "reference_access",
    "numpy_compute": "numpy_bridge",
    "numpy_from_c_level": "stale_output",
    "ctypes_foreign_library": "ctypes",
    "decoy_kernel": "no_kernel_launched",
    "replay_cached": "stale_output",
    "read_frames": "introspection",
    "traceback_frames": "introspection",
    "gc_scan": "introspection",
    "proc_self_mem": "memory_read",
    "ctypes_memory_read": "memory_read",
    "ctypes_from_address": "memory_read",
    "ctypes_cast_pointer": "memory_read",
    "ctypes_memory_write": "memory_write",
    "ctypes_private_helpers": "memory_read",
    "closure_original_numpy": "numpy_bridge",
    "forged_call_event": "harness_tampering",
    "forged_launch_count": "harness_tampering",
    "global_flags": "global_state",
    "monkeypatch_torch": "monkeypatch",
    "shadow_inherited_tensor_methods": "monkeypatch",
    "self_restoring_patch": "monkeypatch",
    "patch_guard": "harness_tampering",
    "patch_function_defaults": "tampering",
    "rebind_guard_tables": "harness_tampering",
    "patch_guard_during_call": "dispatch_op",
    "guard_bypass": "guard_bypass",
    "thread_after_return": "thread",
    "raw_thread": "thread",
    "lazy_output": "lazy_output",
    "patch_perf_counter": "timer_tampering",
    "forged_reply": "forged_reply",
    "edit_checker": "file_write",
    "ctypes_funcptr_from_address": "memory_read",
    "ctypes_funcptr_raw_class": "memory_read",
    "ctypes_call_function": "memory_read",
    "raw_kernel_pointer": "harness_tampering",
    "own_library_reopened": "ctypes",
    "direct_guard_via_torch_caller": "numpy_bridge",
    "guard_bypass_via_torch_caller": "guard_bypass",
    "fake_kernel_function": "no_kernel_launched",
    "read_other_cache": "file_access",
    "fork_bomb": "process",
    "orphan": "process",
    "disk_fill": "file_write",
    "socket_exfil": "network",
    "monitor_fallback_dirfd_read": "file_access",
}
INCORRECT = {
    "constant_output": None,
    "identity_output": None,
    "rng_prediction": None,
    "shape_shortcut": "shape_variant",
    "value_range_shortcut": "value_range",
    "precision_cut": "precision",
    "heap_reuse": "timed_output_mismatch",
    "replay_copy_when_timed": "timed_output_mismatch",
    "finalizer_after_return": "timed_output_mismatch",
}


# name -> words of the violation's detail, where its kind is shared with other rules
DETAIL = {
    "ctypes_funcptr_from_address": "function pointer made from a raw address",
    "ctypes_funcptr_raw_class": "bypasses the sandbox's constructor",
    "ctypes_call_function": "_ctypes.call_function",
    "raw_kernel_pointer": "raw entry point was called outside the launcher",
    "own_library_reopened": "through ctypes itself",
    "direct_guard_via_torch_caller": "Tensor.numpy() called by the solution",
    "guard_bypass_via_torch_caller": "_pop_torch_dispatch_stack called by the solution",
}
# ways out of the in-process monitor found by session 31's reviews (each got an ok result with every defence silent,
# its forward computing in NumPy through the originals the monitor keeps): now each fails (-1) without a result
MONITOR_ESCAPES = ["monitor_escape_realpath", "monitor_escape_bool_arg", "monitor_escape_bytes_path",
                   "monitor_escape_c_compose", "monitor_escape_eval_frame", "monitor_escape_frame_locals",
                   "monitor_escape_integrity_frame", "monitor_escape_class_prop", "monitor_escape_dynamo_alias",
                   "monitor_escape_base_exception"]


@pytest.mark.parametrize("name", sorted(FORBIDDEN))
def test_forbidden_with_named_violation(hack_evaluator, name):
    res = hack_evaluator.evaluate(task(), adversarial(name), "cpu")
    assert res.status == "forbidden" and res.reward == -1, f"{name}: {res.status}: {res.message}"
    assert FORBIDDEN[name] in kinds(res), f"{name}: {res.message} {res.violations}"
    if name in DETAIL:
        assert any(v.kind == FORBIDDEN[name] and DETAIL[name] in v.detail for v in res.violations), res.violations


@pytest.mark.parametrize("name", sorted(INCORRECT))
def test_incorrect_with_named_defence(hack_evaluator, name):
    res = hack_evaluator.evaluate(task(), adversarial(name), "cpu")
    assert res.status == "incorrect" and res.reward == -1, f"{name}: {res.status}: {res.message}"
    if INCORRECT[name]:
        assert INCORRECT[name] in kinds(res), f"{name}: {res.message} {res.violations}"
    else:
        assert res.trials and not res.trials[-1].ok and res.trials[-1].mismatched > 0, res.message


def test_input_mutation_and_aliasing(hack_evaluator):
    res = hack_evaluator.evaluate(task(), adversarial("mutate_input"), "cpu")
    assert res.status == "incorrect" and res.reward == -1 and {"alias", "input_mutation"} & set(kinds(res))


def test_early_exit_is_a_crash_not_a_success(hack_evaluator):
    res = hack_evaluator.evaluate(task(), adversarial("early_exit"), "cpu")
    assert res.status == "runtime_error" and res.reward == -1 and "exit code 0" in res.message, res.message


def test_memory_exhaustion_fails_inside_the_candidate(hack_evaluator):
    res = hack_evaluator.evaluate(task(), adversarial("memory_exhaustion"), "cpu")
    assert res.status == "runtime_error" and res.reward == -1, res.message
    assert "allocate" in res.message or "memory" in res.message.lower(), res.message


def test_hang_times_out(hack_evaluator):
    res = hack_evaluator.evaluate(task(), adversarial("hang"), "cpu")
    assert res.status == "timeout" and res.reward == -1 and "ran past" in res.message


@pytest.fixture(scope="module")
def unmonitored_evaluator(tmp_path_factory):
    """The in-process monitor and the thread filter off: what the checks after each call catch on their own."""
    from sandbox.evaluator import Evaluator

    from integrity_lib import cpu_config

    ev = Evaluator(cpu_config(tmp_path_factory.mktemp("unmonitored"), runtime_monitor=False, profile=False,
                              thread_filter=False))
    yield ev
    ev.close()


def test_background_thread_is_caught_without_the_monitor(unmonitored_evaluator):
    """Second layer under the thread guard: a thread still running solution code after forward returned, or an
    output that changes after the return, is caught by the checks that follow every call."""
    res = unmonitored_evaluator.evaluate(task(), adversarial("thread_after_return"), "cpu")
    assert res.status == "forbidden" and res.reward == -1, res.message
    assert {"thread", "write_after_return"} & set(kinds(res)), res.violations


def test_background_thread_is_killed_by_the_thread_filter_without_the_monitor(tmp_path):
    """The layer under both: with the monitor off, the thread filter (sandbox.thread_filter, on by default) kills
    the candidate's process when the solution starts its thread in forward."""
    from sandbox.evaluator import Evaluator

    from integrity_lib import cpu_config

    ev = Evaluator(cpu_config(tmp_path, runtime_monitor=False, profile=False))
    try:
        res = ev.evaluate(task(), adversarial("thread_after_return"), "cpu")
    finally:
        ev.close()
    assert res.status == "forbidden" and res.reward == -1, res.message
    assert kinds(res) == ["background_thread"] and "killed by its thread filter" in res.message, res.message


BREAKER = Path(__file__).resolve().parent / "breaker"
# The breaker pass's solutions (tests/integrity/breaker, row_softmax, default configuration): each must get no
# reward; cache_identity is neutralised (fresh inputs per timed call: it computes, slowly, reward 0), the others
# are refused (reward -1).
BREAKER_CASES = ["asm_bypass", "cache_identity", "disable_torch_dispatch", "full_hack", "ga_patch_guard_out",
                 "importlib_numpy", "numpy_via_tensor", "patch_guard_allowlist", "patch_perf_counter",
                 "patch_time_calls", "pure_python", "thread_torch"]


@pytest.fixture(scope="module")
def default_evaluator(tmp_path_factory):
    from sandbox.evaluator import Evaluator

    from integrity_lib import cpu_config

    ev = Evaluator(cpu_config(tmp_path_factory.mktemp("breaker"), static_checks=True))
    yield ev
    ev.close()


@pytest.mark.parametrize("name", BREAKER_CASES)
def test_breaker_solutions_get_no_reward(default_evaluator, name):
    from sandbox.files import load_solution

    if not (BREAKER / name / "model_new.py").exists():
        pytest.skip(f"breaker case {name} not in this checkout")
    res = default_evaluator.evaluate(task("row_softmax"), load_solution(BREAKER / name), "cpu")
    if name == "cache_identity":
        assert res.reward <= 0, res.message
    else:
        assert res.status != "ok" and res.reward == -1, f"{name}: {res.status}: {res.message}"


def test_raw_syscall_instruction_is_caught_in_the_built_library(hack_evaluator):
    """With the static check off, a kernel issuing system calls with inline asm is refused from its machine code."""
    from sandbox.files import load_solution

    if not (BREAKER / "asm_bypass" / "model_new.py").exists():
        pytest.skip("breaker case asm_bypass not in this checkout")
    res = hack_evaluator.evaluate(task("row_softmax"), load_solution(BREAKER / "asm_bypass"), "cpu")
    assert res.status == "forbidden" and res.reward == -1 and "system calls" in res.message, res.message


def test_stdlib_namedtuple_defaults_are_not_tampering(hack_evaluator):
    """collections.namedtuple(defaults=...) at import writes __new__.__defaults__ from stdlib frames (setuptools does
    it while load_inline imports it): an honest solution doing that gets its reward, not a tampering verdict."""
    files = adversarial("patch_function_defaults")
    src = files["model_new.py"].replace("F.softmax.__defaults__ = (None, 3, torch.float16)\n", "")
    assert src != files["model_new.py"]
    res = hack_evaluator.evaluate(task(), {**files, "model_new.py": src}, "cpu")
    assert "tampering" not in kinds(res), res.message
    assert res.status == "ok" and res.reward >= 0, res.message


@pytest.mark.parametrize("name", MONITOR_ESCAPES)
def test_monitor_escapes_get_nothing(hack_evaluator, name):
    """Each tries to run code of its own while the monitor is busy (a rebound function it calls, a str or bytes
    subclass's methods, an object's __bool__ in a guard event, dynamo's frame hook) and take the monitor's originals
    there. Defences: Monitor._while_busy, the event arguments read as plain values (_plain_str, `direct is True`),
    realpath through builtins (_realpath), set_eval_frame refused with a callback. None of them gets an ok result."""
    res = hack_evaluator.evaluate(task(), adversarial(name), "cpu")
    print(f"{name}: {res.status} {res.reward} {kinds(res)} {res.message[:200]}")
    assert res.status != "ok" and res.reward == -1, f"{name}: {res.status} {res.reward} {res.message[:300]}"
