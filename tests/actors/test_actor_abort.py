"""A hard stop: `abort` cancels the running episodes (their sandbox jobs still in flight on a real node), the
actor returns, nothing half-done reaches the sink, and the policy versions and the time split are left clean.
`stop` alone lets the running episodes finish."""

from __future__ import annotations

import threading
import time
import uuid

from _helpers import MODEL_NEW, ScriptedPolicy, call, make_task, slow_kernel, stages_for_tests, write
from actors.actor import Actor, cycle_tasks, run_actor
from actors.config import ActorConfig, AgentConfig
from actors.sandbox_stages import SandboxStages
from actors.weights import PolicyVersions
from learner.chat import ChatFormat


class Sink:
    def __init__(self):
        self.episodes = []

    def put(self, episode):
        self.episodes.append(episode)


def _wait(pred, what, timeout_s=120.0):
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def test_abort_cancels_running_episodes_and_stop_lets_them_finish(tokenizer, sandbox_client):
    # Each episode's first turn writes a kernel whose -O3 build takes seconds (a fresh variant per run, so the
    # node's result cache cannot answer it) and compiles it: abort lands while those jobs are in flight.
    slow = f"// {uuid.uuid4().hex}\n" + slow_kernel(1500)
    script = [write("kernels/fused_chain.c", slow) + "\n" + write("model_new.py", MODEL_NEW) + "\n" + call("compile"),
              call("finish")]
    policy = ScriptedPolicy(tokenizer, {"abort me": script})
    cfg = ActorConfig(concurrent_episodes=2, actor_id="abort",
                      agent=AgentConfig(max_turns=3, max_context_tokens=400_000, max_new_tokens_per_turn=300_000,
                                        solution_format="cpu"))
    stages = SandboxStages(sandbox_client, stages_for_tests())
    versions, sink = PolicyVersions(policy), Sink()
    actor = Actor(cfg, ChatFormat(tokenizer), stages, versions, sink, "cpu")
    stop, abort, out = threading.Event(), threading.Event(), {}
    thread = threading.Thread(target=lambda: out.update(run_actor(actor, cycle_tasks([make_task("abort me")]),
                                                                  stop=stop, abort=abort)), daemon=True)
    thread.start()
    _wait(lambda: actor.batcher.in_tools == 2, "both episodes inside their compile call")
    stop.set()
    abort.set()
    thread.join(60)
    assert not thread.is_alive(), "abort did not end the actor"
    assert out["episodes"] == 0 and out["episodes_aborted"] == 2
    assert sink.episodes == [] and stages.calls["compile"] == 2 and stages.calls["final"] == 0
    assert any(n["outstanding"] > 0 for n in sandbox_client.nodes().values())  # the jobs were still running
    assert versions.held_versions() == [1]
    split = actor.clock.snapshot()
    time.sleep(0.3)
    assert actor.clock.snapshot()["sandbox_s"] == split["sandbox_s"]  # no activity left counted as busy

    # stop without abort: the running episodes finish (their compile is answered) and reach the sink
    sink2 = Sink()
    actor2 = Actor(cfg, ChatFormat(tokenizer), SandboxStages(sandbox_client, stages_for_tests()), PolicyVersions(policy),
                   sink2, "cpu")
    stop2, out2 = threading.Event(), {}
    thread2 = threading.Thread(target=lambda: out2.update(run_actor(actor2, cycle_tasks([make_task("abort me")]),
                                                                    stop=stop2)), daemon=True)
    thread2.start()
    _wait(lambda: actor2.batcher.in_tools >= 1, "an episode inside its compile call")
    stop2.set()
    thread2.join(300)
    assert not thread2.is_alive()
    assert out2["episodes_aborted"] == 0 and out2["episodes"] >= 1
    assert len(sink2.episodes) == out2["episodes"] and all(e.status == "finished" for e in sink2.episodes)


def test_cli_signals_stop_then_abort():
    import os
    import signal

    from actors.cli import _stop_on_signals

    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        stop, abort = _stop_on_signals()
        os.kill(os.getpid(), signal.SIGTERM)
        _wait(stop.is_set, "stop after the first signal", 10)
        assert not abort.is_set()
        os.kill(os.getpid(), signal.SIGINT)
        _wait(abort.is_set, "abort after the second signal", 10)
    finally:
        for s, h in saved.items():
            signal.signal(s, h)
