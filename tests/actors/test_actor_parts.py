"""The actor's parts without a sandbox: workspace rules, observations, skill text, batching, time split,
weight versions and the tensor naming of the weights channel."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from _helpers import KERNEL, MODEL_NEW, ScriptedPolicy, make_task, write
from actors.activity import ActivityClock
from actors.batcher import GenerationBatcher
from actors.observations import compile_observation, first_errors, profile_observation, verify_observation
from actors.sampler import SamplingParams
from actors.skill import system_prompt, task_prompt, tool_schemas
from actors.weights import PolicyVersions
from actors.workspace import AgentWorkspace, WorkspaceRuleError
from learner.chat import parse_tool_calls
from sandbox.result import Distribution, EvalResult, SpeedUp, TimingStats, TrialResult, Violation


# ------------------------------------------------------------------------------------------ workspace
@pytest.mark.parametrize("path, why", [
    ("model.py", "read-only"), ("../model_new.py", "outside the workspace"), ("/etc/passwd", "outside"),
    ("kernels/../model.py", "outside"), ("kernels/sub/k.cpp", "cannot be written"), ("setup.py", "cannot be written"),
    ("kernels/k.py", "must end in"), ("kernels/k.cu", "must end in"), ("kernels/.hidden.cpp", "letters, digits"),
    ("kernels\\k.cpp", "outside"), ("", "non-empty"), (7, "non-empty"),
])
def test_workspace_refuses_writes_outside_kernels_and_model_new(path, why):
    ws = AgentWorkspace("ref", "cpu")
    with pytest.raises(WorkspaceRuleError, match=why):
        ws.write(path, "x")
    assert ws.files == {}


def test_workspace_writes_reads_lists_and_bounds():
    ws = AgentWorkspace("REFERENCE TEXT", "cubin")
    assert ws.write("model_new.py", MODEL_NEW).startswith("created model_new.py")
    assert ws.write("kernels/k.cu", "a\nb").startswith("created kernels/k.cu (2 lines")
    assert ws.write("kernels/k.cu", "c\n").startswith("replaced")
    assert ws.read("model.py", 100) == "REFERENCE TEXT" and ws.read("kernels/k.cu", 100) == "c\n"
    assert "more characters not shown" in ws.read("model_new.py", 10)
    with pytest.raises(WorkspaceRuleError, match="no file 'nope.cu'.*model.py, kernels/k.cu, model_new.py"):
        ws.read("nope.cu", 100)
    listing = ws.listing()
    assert "model.py" in listing and "kernels/k.cu (2 bytes)" in listing and "model_new.py" in listing
    with pytest.raises(WorkspaceRuleError, match="over the limit"):
        ws.write("kernels/big.cu", "x" * (256 * 1024 + 1))
    with pytest.raises(WorkspaceRuleError, match="must be a string"):
        ws.write("kernels/a.cu", 3)
    for i in range(30):
        ws.write(f"kernels/k{i}.cuh", "")
    with pytest.raises(WorkspaceRuleError, match="already holds 32 files"):
        ws.write("kernels/one_more.cuh", "")
    assert ws.snapshot() == ws.files and ws.snapshot() is not ws.files


# ------------------------------------------------------------------------------------------ observations
def _timing(milestone=1):
    d = lambda m: Distribution(median_ms=m, iqr_ms=m / 10, min_ms=m, mean_ms=m, reps=5)  # noqa: E731
    return TimingStats(device="cpu", calls_per_rep=3, warmup_calls=2, eager=d(2.0), compiled=d(1.0), candidate=d(0.5),
                       speedup_eager=SpeedUp(4.0, 3.5, 4.5, 0.9), speedup_compile=SpeedUp(2.0, 1.8, 2.2, 0.9),
                       milestone=milestone, milestone_reason="at least 5% faster than eager and torch.compile")


def test_compile_observation_keeps_the_first_errors():
    log = "\n".join(["kernels/k.cu: In function 'f':"] + [f"kernels/k.cu:{i}:1: error: bad thing {i}" for i in range(40)])
    res = EvalResult.failure("compile_error", "build failed: ...", compile_log=log)
    text = compile_observation(res, error_lines=5)
    assert text.startswith("compile: COMPILE_ERROR") and "In function 'f'" in text and "bad thing 3" in text
    assert "bad thing 4" not in text and "[36 more lines; 40 error line(s) in all]" in text
    assert first_errors("warning: w\nnote: n\nx.c:1: error: e", 2) == "x.c:1: error: e"
    ok = EvalResult(status="ok", reward=0.0, build_cached=True)
    assert compile_observation(ok) == "compile: ok (unchanged sources: cached build)"
    forbidden = EvalResult.failure("forbidden", "built library: calls system",
                                   violations=[Violation("symbol", "the built library calls system")])
    assert "- symbol: the built library calls system" in compile_observation(forbidden)


def test_verify_observation_per_trial_with_largest_error():
    trials = [TrialResult(0, True, 1e-7, 2e-6, 0, 100), TrialResult(1, False, 3.5, 0.9, 12, 100, "outside tolerance")]
    text = verify_observation(EvalResult.failure("incorrect", "trial 1: 12 of 100 elements outside", trials=trials))
    assert text.splitlines()[1:] == ["trial 0: pass (max abs err 1e-07, max rel err 2e-06)",
                                     "trial 1: FAIL (12 of 100 elements outside tolerance, max abs err 3.5, "
                                     "max rel err 0.9)"]
    good = EvalResult(status="ok", reward=0.0, trials=trials[:1] * 2)
    assert verify_observation(good).startswith("verify: PASS: correct on 2 of 2 trials (largest abs error 1e-07)")
    crashed = EvalResult.failure("runtime_error", "trial 0: the candidate worker crashed (SIGSEGV)")
    assert verify_observation(crashed) == "verify: RUNTIME_ERROR: trial 0: the candidate worker crashed (SIGSEGV)"


def test_profile_observation_is_a_small_table():
    text = profile_observation(EvalResult(status="ok", reward=3.0, timing=_timing(3)))
    lines = text.splitlines()
    assert lines[0] == "profile: reward 3: at least 5% faster than eager and torch.compile"
    assert [ln.split()[0] for ln in lines[2:5]] == ["eager", "torch.compile", "yours"]
    assert "speed-up vs eager: 4x [3.5, 4.5] (90% interval)" in text and "vs torch.compile: 2x [1.8, 2.2]" in text
    long = profile_observation(EvalResult(status="ok", reward=3.0, timing=_timing(3)), max_chars=80)
    assert len(long) <= 80 and long.endswith("not shown]")


# ------------------------------------------------------------------------------------------ skill text
@pytest.mark.parametrize("fmt, marker", [("cpu", "extern \"C\" void"), ("cubin", "__global__"),
                                         ("extension", "PYBIND11_MODULE")])
def test_system_prompt_names_layout_rules_tools_format_and_goal(fmt, marker):
    text = system_prompt(fmt, "multi_turn", 12)
    for needle in ("model_new.py", "kernels/", "Read-only", "no fallbacks", "5% faster", "torch.compile", marker,
                   "at most 12 replies", "<tool_call>", "</tool_call>"):
        assert needle in text, needle
    for tool in tool_schemas(fmt):
        assert f'"name": "{tool}"' in text
    single = system_prompt(fmt, "single_turn")
    assert '"name": "write_file"' in single and '"name": "compile"' not in single and "one reply" in single
    with pytest.raises(ValueError, match="unknown solution format"):
        system_prompt("ptx")


def test_task_prompt_and_scripted_calls_parse_with_the_one_syntax():
    task = make_task("chain", "t1")
    assert task.reference.strip() in task_prompt(task, "cpu") and task_prompt(task, "cpu").startswith("Task t1: chain")
    calls = parse_tool_calls("thinking...\n" + write("kernels/k.cpp", KERNEL))
    assert calls[0].name == "write_file" and calls[0].arguments["content"] == KERNEL


# ------------------------------------------------------------------------------------------ batching
class _SlowPolicy(ScriptedPolicy):
    def generate(self, prompts, settings):
        time.sleep(0.05)
        return super().generate(prompts, settings)


def test_batcher_batches_waiting_episodes_and_separates_versions(tokenizer):
    from learner.chat import ChatFormat, Message

    chat = ChatFormat(tokenizer)
    v1 = _SlowPolicy(tokenizer, {"a": ["one"]}, version=1)
    v2 = _SlowPolicy(tokenizer, {"a": ["two"]}, version=2)
    prompt = chat.render([Message("user", "Task t: a (solution format: cpu)")], add_generation_prompt=True).ids.tolist()
    clock = ActivityClock()

    async def main():
        b = GenerationBatcher(max_batch=4, gather_s=0.5, clock=clock)
        b.reset()
        b.episodes = 7
        runner = asyncio.create_task(b.run())
        sp = SamplingParams(max_new_tokens=8)
        jobs = [b.generate(v1, prompt, sp) for _ in range(5)] + [b.generate(v2, prompt, sp) for _ in range(2)]
        outs = await asyncio.gather(*jobs)
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)
        return outs, b.stats

    outs, stats = asyncio.run(main())
    # all 7 waiting: no gather wait; then the rest (they waited through a call) at once; v1 in batches of at
    # most 4, v2 on its own
    assert stats["gather_waits"] == 0
    assert sorted(v1.calls) == [1, 4] and v2.calls == [2] and stats["sequences"] == 7
    assert [tokenizer.decode(o.tokens[:-1]) for o in outs] == ["one"] * 5 + ["two"] * 2
    snap = clock.snapshot()  # three calls of at least 50 ms each were recorded as sampling
    assert 0.14 <= snap["sampling_s"] <= snap["wall_s"] and snap["sandbox_s"] == 0.0


def test_batcher_gives_every_episode_of_a_failed_call_the_error(tokenizer):
    class Broken:
        version, name = 1, "broken"

        def generate(self, prompts, settings):
            raise RuntimeError("device lost")

    async def main():
        b = GenerationBatcher(max_batch=8, gather_s=0.01)
        b.reset()
        b.episodes = 2
        runner = asyncio.create_task(b.run())
        res = await asyncio.gather(*[b.generate(Broken(), [1], SamplingParams()) for _ in range(2)],
                                   return_exceptions=True)
        runner.cancel()
        return res

    assert [str(r) for r in asyncio.run(main())] == ["device lost", "device lost"]


def test_activity_clock_splits_time():
    t = [100.0]
    clock = ActivityClock(now=lambda: t[0])
    clock.start("sandbox")            # 100: one sandbox job
    t[0] = 102.0
    clock.start("sandbox")            # 102: two
    with clock.busy("sampling"):      # 102-103.5: sampling too
        t[0] = 103.5
    clock.stop("sandbox")
    t[0] = 104.0
    clock.stop("sandbox")             # 104: nothing
    t[0] = 107.0
    with clock.busy("sampling"):      # 107-108: sampling alone
        t[0] = 108.0
    t[0] = 110.0
    assert clock.snapshot() == {"wall_s": 10.0, "sampling_s": 2.5, "sandbox_s": 4.0, "both_s": 1.5, "idle_s": 5.0}


# ------------------------------------------------------------------------------------------ weights
def test_policy_versions_keep_an_old_version_while_an_episode_uses_it():
    class P:
        def __init__(self, v):
            self.version = v

    versions = PolicyVersions()
    with pytest.raises(RuntimeError, match="no policy yet"):
        versions.acquire()
    p1, p2, p3 = P(1), P(2), P(3)
    versions.set(p1)
    a = versions.acquire()
    versions.set(p2)
    assert a is p1 and versions.held_versions() == [1, 2]
    b = versions.acquire()
    assert b is p2
    versions.release(a)
    assert versions.held_versions() == [2]
    versions.set(p3)
    assert versions.held_versions() == [2, 3]
    versions.release(b)
    assert versions.held_versions() == [3] and versions.swaps == 2


def test_weights_naming_round_trip_and_errors():
    from actors.weights import model_from_tensors, policy_tensors, random_policy_tensors
    from learner.model import ModelConfig

    cfg = ModelConfig.tiny()
    tensors = random_policy_tensors(cfg, seed=3)
    assert "backbone/layers/wq" in tensors and "lm_head" in tensors
    assert np.all(tensors["backbone/final_norm"] == 1) and np.all(tensors["backbone/layers/bq"] == 0)
    back = policy_tensors(model_from_tensors(cfg, tensors))
    assert back.keys() == tensors.keys() and all(np.array_equal(back[k], tensors[k]) for k in tensors)
    bf16 = random_policy_tensors(cfg.replace(param_dtype="bfloat16"), seed=3)
    assert str(bf16["lm_head"].dtype) == "bfloat16"
    assert str(policy_tensors(model_from_tensors(cfg.replace(param_dtype="bfloat16"), bf16))["lm_head"].dtype) == \
        "bfloat16"
    with pytest.raises(ValueError, match="'lm_head' is missing"):
        model_from_tensors(cfg, {k: v for k, v in tensors.items() if k != "lm_head"})
    with pytest.raises(ValueError, match="shape"):
        model_from_tensors(cfg.replace(hidden_size=32), tensors)


def test_jax_policy_waits_while_the_sandbox_times_on_its_gpu(tokenizer, tmp_path):
    import threading

    from actors.policy import JaxPolicy
    from actors.sampler import Sampler
    from actors.weights import model_from_tensors, random_policy_tensors
    from learner.model import ModelConfig
    from test_actor_jax import SAMPLER_CONFIG  # same shapes: the sampler's compilations are shared in-process

    cfg = ModelConfig.tiny(vocab_size=tokenizer.vocab_size)
    sampler = Sampler(model_from_tensors(cfg, random_policy_tensors(cfg, seed=5)), SAMPLER_CONFIG)
    from sandbox.service_lock import DeviceTimingLock

    lock = DeviceTimingLock("gpu-test", tmp_path)
    policy = JaxPolicy(sampler, version=4, timing_lock=lock)
    sp = [SamplingParams(max_new_tokens=3, temperature=0.0, stop_token_ids=tuple(tokenizer.stop_token_ids))]
    first = policy.generate([[1, 2, 3]], sp)  # no timer around (compiled already if the JAX test ran first)
    assert 1 <= len(first[0].tokens) <= 3 and policy.lock_waits == 0 and policy.lock_wait_s < 0.5
    done = threading.Event()
    with lock.timing(timeout_s=1.0) as state:  # the sandbox worker times a kernel
        assert state.acquired
        t = threading.Thread(target=lambda: (policy.generate([[1, 2, 3]], sp), done.set()))
        t.start()
        assert not done.wait(0.5)  # the sampler call waits for the timer
    assert done.wait(30) and policy.lock_waits == 1
    t.join()
    assert policy.lock_wait_s >= 0.5  # the wait is counted: at least the 0.5 s the timer held the lock

    class CountingLock(DeviceTimingLock):  # the real lock, counting its shared sections
        entered = 0

        def shared(self, timeout_s=None):
            CountingLock.entered += 1
            return super().shared(timeout_s)

    stepped = JaxPolicy(sampler, version=4, timing_lock=CountingLock("gpu-test", tmp_path))
    long = [SamplingParams(max_new_tokens=24, temperature=0.0, stop_token_ids=())]
    assert len(stepped.generate([[1, 2, 3]], long)[0].tokens) == 24
    # the lock is taken per device step, not per call: the prefill, then each 8-step decode chunk, so a timer
    # waits for one chunk at most
    assert CountingLock.entered >= 1 + 23 // 8, CountingLock.entered


def test_refresher_refuses_weights_that_do_not_fit_and_takes_the_next(tmp_path):
    from _helpers import free_port
    from actors.weights import WeightsRefresher, model_from_tensors, random_policy_tensors
    from learner.model import ModelConfig
    from protocol.weights_channel import WeightsFetcher, WeightsPublisher

    cfg = ModelConfig.tiny()
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    with WeightsPublisher(endpoint) as publisher, WeightsFetcher(endpoint, timeout_s=2.0) as fetcher:
        publisher.start()
        refresher = WeightsRefresher(fetcher, lambda u: (u.version, model_from_tensors(cfg, u.tensors)))
        assert refresher.poll() is None and refresher.version == -1  # nothing published yet
        publisher.publish(1, random_policy_tensors(cfg.replace(hidden_size=32), seed=1))
        assert refresher.poll() is None and refresher.stats["refused"] == 1 and refresher.version == -1
        assert refresher.poll() is None and refresher.stats["refused"] == 1  # not fetched again
        publisher.publish(2, random_policy_tensors(cfg, seed=2))
        version, _model = refresher.poll()
        assert version == 2 == refresher.version and refresher.stats["fetched"] == 1


def test_learner_curve_keys_go_together(tmp_path):
    from actors.config import ActorConfig
    from protocol.auth import client_curve, init_keys

    with pytest.raises(ValueError, match="learner_curve_secret_key and learner_public_key"):
        ActorConfig(learner_curve_secret_key="/k/actor0.key_secret")
    assert client_curve("", "", who="actor") is None
    keys = init_keys(tmp_path, ["actor0"])
    cfg = ActorConfig(learner_curve_secret_key=keys["client_actor0_secret_key"],
                      learner_public_key=keys["server_public_key"])
    curve = client_curve(cfg.learner_curve_secret_key, cfg.learner_public_key, who="actor")
    assert str(curve.server_public_key_file) == keys["server_public_key"]
    with pytest.raises(FileNotFoundError, match="server_public_key_file"):
        client_curve(keys["client_actor0_secret_key"], str(tmp_path / "missing.key"), who="actor")


def _failing_actor(tokenizer, client, **cfg):
    from _helpers import stages_for_tests
    from actors.actor import Actor
    from actors.config import ActorConfig, AgentConfig
    from actors.sandbox_stages import SandboxStages
    from learner.chat import ChatFormat

    class Broken:
        version, name = 0, "broken"

        def generate(self, prompts, settings):
            raise FloatingPointError("sampler: non-finite behaviour log-probs")

    class Sink:
        def __init__(self):
            self.statuses = []

        def put(self, episode):
            self.statuses.append(episode.status)

    sink = Sink()
    config = ActorConfig(failure_backoff_max_s=10.0, agent=AgentConfig(solution_format="cpu"), **cfg)
    return Actor(config, ChatFormat(tokenizer), SandboxStages(client, stages_for_tests()), PolicyVersions(Broken()),
                 sink, "cpu"), sink


def test_actor_backs_off_after_failed_episodes(tokenizer):
    # A policy that fails every call (the h200 preset's NaN sampler): without a backoff the actor started 13,467
    # policy_error episodes in two minutes. With it, starts wait 0.2, 0.4, 0.8 s ... after failures in a row.
    import threading

    from actors.actor import cycle_tasks, run_actor
    from sandbox.client import SandboxClient

    with SandboxClient(["tcp://127.0.0.1:9"]) as client:  # never asked: the policy fails first
        actor, sink = _failing_actor(tokenizer, client, concurrent_episodes=1, failure_backoff_s=0.2)
        stop = threading.Event()
        threading.Timer(1.5, stop.set).start()
        summary = run_actor(actor, cycle_tasks([make_task("fails")]), stop=stop)
        assert sink.statuses and set(sink.statuses) == {"policy_error"}
        # 0.2 + 0.4 + 0.8 s of waits fit in the 1.5 s window: at most 4 episodes started (a slower box starts fewer)
        assert len(sink.statuses) <= 4 and summary["backoffs"] == len(sink.statuses) == actor.failures_in_a_row
        # the same policy without the wait: 20 episodes, no backoff
        actor, sink = _failing_actor(tokenizer, client, concurrent_episodes=1, failure_backoff_s=0.0)
        summary = run_actor(actor, cycle_tasks([make_task("fails")]), max_episodes=20)
        assert len(sink.statuses) == 20 and summary["backoffs"] == 0


def test_backoff_counts_a_burst_once_doubles_per_wait_and_is_capped(tokenizer):
    from sandbox.client import SandboxClient

    def wait_set_by(fail_times: int) -> tuple[float, float]:
        """Fail `fail_times` episodes; bounds (lo, hi) on the wait the first of them set, read off the hold: the
        calls' own time is all that separates them."""
        t0 = time.monotonic()
        for _ in range(fail_times):
            actor._note_ending(failed=True, why="policy_error")
        t1 = time.monotonic()
        lo, hi = actor._hold_until - t1, actor._hold_until - t0
        return lo, hi

    with SandboxClient(["tcp://127.0.0.1:9"]) as client:
        actor, _ = _failing_actor(tokenizer, client, concurrent_episodes=4, failure_backoff_s=0.2)
        lo, hi = wait_set_by(4)  # four running episodes of one outage end together: one wait of 0.2 s, not 0.2 * 2 ** 3
        assert (actor.stats["backoffs"], actor.failures_in_a_row) == (1, 4) and lo <= 0.2 <= hi + 1e-9
        actor._hold_until = 0.0  # the wait is over: the next failure doubles it
        lo, hi = wait_set_by(1)
        assert actor.stats["backoffs"] == 2 and lo <= 0.4 <= hi + 1e-9
        actor._hold_until, actor._backoff_steps = 0.0, 2000  # a long outage: capped, and 2 ** 2000 fits no float
        lo, hi = wait_set_by(1)
        assert lo <= 10.0 <= hi + 1e-9
        actor._note_ending(failed=False, why="ok")  # any other ending clears it
        assert (actor.failures_in_a_row, actor._backoff_steps, actor._hold_until) == (0, 0, 0.0)


def test_cycle_tasks_draws_each_task_group_size_times_in_a_row_and_every_task_each_pass():
    import itertools

    from actors.actor import cycle_tasks

    tasks = [make_task(f"t{i}", task_id=f"t{i}") for i in range(5)]
    ids = [t.id for t in itertools.islice(cycle_tasks(tasks, seed=7, group_size=3), 30)]
    groups = [ids[i:i + 3] for i in range(0, 30, 3)]
    assert all(len(set(g)) == 1 for g in groups)
    firsts = [g[0] for g in groups]
    assert sorted(firsts[:5]) == sorted(firsts[5:]) == [t.id for t in tasks]
    assert [t.id for t in itertools.islice(cycle_tasks(tasks, seed=7), 5)] == firsts[:5]  # same order, groups of 1
    with pytest.raises(ValueError, match="group_size"):
        next(cycle_tasks(tasks, group_size=0))
