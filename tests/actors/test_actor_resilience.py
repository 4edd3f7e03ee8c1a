"""The actor survives its neighbours: a sandbox node killed in the middle of an episode (the job moves to
another node, or the episode ends `sandbox_error` and the actor goes on when the node is back), and the
learner stopped and started again (unacked trajectories are kept, then delivered; weights refresh resumes)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from _helpers import (BROKEN_KERNEL, MODEL_NEW, GatedPolicy, NodeProcess, call, free_port, make_task, slow_kernel,
                      stages_for_tests, write)
from actors.actor import Actor, TrajectorySink, cycle_tasks, run_actor
from actors.config import ActorConfig, AgentConfig
from actors.sandbox_stages import SandboxStages
from actors.weights import PolicyVersions, WeightsRefresher
from learner.chat import ChatFormat
from sandbox.client import SandboxClient

# Turn 0 compiles a kernel whose build takes seconds (the job to interrupt); turn 1 breaks the kernel and
# finishes, so the final evaluation fails at the build (no slow verification on a cold node).
SCRIPT = [write("kernels/chain.cpp", slow_kernel()) + "\n" + write("model_new.py", MODEL_NEW) + "\n" + call("compile"),
          write("kernels/chain.cpp", BROKEN_KERNEL) + "\n" + call("finish")]


class Sink:
    def __init__(self):
        self.episodes = []

    def put(self, ep):
        self.episodes.append(ep)


def _wait(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _start_actor(tokenizer, client, policy, tasks, sink, max_episodes, **stages):
    cfg = ActorConfig(concurrent_episodes=1, actor_id="resilient",
                      agent=AgentConfig(max_turns=4, max_context_tokens=400_000, max_new_tokens_per_turn=300_000,
                                      solution_format="cpu"))
    actor = Actor(cfg, ChatFormat(tokenizer), SandboxStages(client, stages_for_tests(**stages)),
                  PolicyVersions(policy), sink, "cpu")
    out: dict = {}
    thread = threading.Thread(target=lambda: out.update(run_actor(actor, tasks, max_episodes=max_episodes)),
                              daemon=True)
    thread.start()
    return actor, thread, out


def _node_with_job(client) -> str | None:
    for address, n in client.nodes().items():
        if n["outstanding"] > 0:
            return address
    return None


@pytest.mark.slow
def test_killed_node_mid_episode_job_moves_to_the_other_node(tokenizer, tmp_path):
    nodes = {n.endpoint: n for n in (NodeProcess(tmp_path, name="a").start(), NodeProcess(tmp_path, name="b").start())}
    try:
        for n in nodes.values():
            n.wait_ready()
        with SandboxClient(list(nodes), client_id="failover", heartbeat_s=0.5, attempts=2) as client:
            policy = GatedPolicy(tokenizer, {"failover": SCRIPT})
            sink = Sink()
            _, thread, _ = _start_actor(tokenizer, client, policy, [make_task("failover")], sink, 1)
            policy.release(1)
            _wait(lambda: _node_with_job(client) is not None, 60, "the compile job to reach a node")
            victim = _node_with_job(client)
            nodes[victim].kill()  # its build takes seconds: the job is surely in flight
            policy.release(1)
            thread.join(180)
            assert not thread.is_alive()
            assert client.rpc.stats["dead_endpoints"] >= 1
            assert client.rpc.stats["resends"] >= 1  # the job really moved to the other node
        (ep,) = sink.episodes
        assert ep.status == "finished" and ep.trainable
        assert ep.tool_log[2] == {**ep.tool_log[2], "tool": "compile", "ok": True, "status": "ok"}
        assert [m.content for m in ep.messages if m.role == "tool"][-1].startswith("compile: ok")
        assert ep.final.status == "compile_error" and ep.reward == -1.0
    finally:
        for n in nodes.values():
            n.kill()


@pytest.mark.slow
def test_only_node_killed_episode_ends_clearly_and_the_actor_goes_on(tokenizer, tmp_path):
    node = NodeProcess(tmp_path, name="only").start()
    try:
        node.wait_ready()
        with SandboxClient([node.endpoint], client_id="lonely", heartbeat_s=0.5) as client:
            policy = GatedPolicy(tokenizer, {"doomed": SCRIPT, "after": SCRIPT})
            sink = Sink()
            _, thread, out = _start_actor(tokenizer, client, policy, [make_task("doomed"), make_task("after")], sink,
                                          2, unavailable_after_s=3.0)
            policy.release(1)
            _wait(lambda: _node_with_job(client) is not None, 60, "the compile job to reach the node")
            node.kill()
            _wait(lambda: len(sink.episodes) == 1, 60, "the first episode to end")
            doomed = sink.episodes[0]
            assert doomed.status == "sandbox_error" and not doomed.trainable and "no sandbox node alive" in doomed.error
            assert thread.is_alive()  # the actor goes on with the next episode
            node = NodeProcess(tmp_path, port=node.port, name="only").start()
            node.wait_ready()
            _wait(lambda: client.nodes()[node.endpoint]["alive"], 30, "the node to be seen again")
            policy.release(2)
            thread.join(180)
            assert not thread.is_alive()
        after = sink.episodes[1]
        assert after.status == "finished" and after.tool_log[2]["status"] == "ok" and after.final.status == "compile_error"
        assert out["by_status"] == {"sandbox_error": 1, "finished": 1} and out["episode_crashes"] == 0
    finally:
        node.kill()


def test_learner_restart_unacked_trajectories_are_kept_and_delivered(tokenizer, sandbox_client, tmp_path):
    from protocol.trajectory_channel import TrajectoryOutbox, TrajectoryReceiver
    from protocol.weights_channel import WeightsFetcher, WeightsPublisher

    traj_ep, weights_ep = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    spool = tmp_path / "spool"
    script = {"learner": [write("kernels/chain.cpp", BROKEN_KERNEL) + "\n" + write("model_new.py", MODEL_NEW) + "\n"
                          + call("finish")]}
    permits = threading.Semaphore(0)

    def learner_up(version: int):
        receiver = TrajectoryReceiver(traj_ep, spool, learner_id="learner").start()
        publisher = WeightsPublisher(weights_ep).start()
        publisher.publish(version, {"w": np.full(4, version, np.float32)})
        return receiver, publisher

    def learner_down(receiver, publisher):
        receiver.close()
        publisher.close()

    receiver, publisher = learner_up(1)
    outbox = TrajectoryOutbox(traj_ep, actor_id="resilient", resend_after_s=0.5)
    fetcher = WeightsFetcher(weights_ep, actor_id="resilient", timeout_s=0.3)
    refresher = WeightsRefresher(fetcher, lambda u: GatedPolicy(tokenizer, script, version=u.version, permits=permits),
                                 timeout_s=0.3)
    cfg = ActorConfig(concurrent_episodes=1, actor_id="resilient", weights_poll_s=0.2,
                      agent=AgentConfig(max_turns=2, max_context_tokens=200_000, solution_format="cpu"))
    sink = TrajectorySink(outbox, "resilient")
    actor = Actor(cfg, ChatFormat(tokenizer), SandboxStages(sandbox_client, stages_for_tests()), PolicyVersions(),
                  sink, "cpu", refresher=refresher)
    stop = threading.Event()
    thread = threading.Thread(target=lambda: run_actor(actor, cycle_tasks([make_task("learner")]), stop=stop),
                              daemon=True)
    thread.start()
    try:
        permits.release(2)
        _wait(lambda: receiver.stats["stored"] == 2, 60, "two trajectories stored")
        learner_down(receiver, publisher)  # the learner goes away
        permits.release(2)
        _wait(lambda: sink.stats["sent"] == 4 and refresher.stats["failures"] >= 1, 60,
              "two more episodes while the learner is away")
        time.sleep(1.0)  # a few resend rounds towards nobody
        assert outbox.pending == 2 and outbox.stats["acked"] == 2
        receiver, publisher = learner_up(2)  # it comes back, with the same spool and a newer version
        _wait(lambda: outbox.pending == 0, 60, "the kept trajectories to be delivered")
        _wait(lambda: actor.versions.newest_version == 2, 30, "weights version 2")
        # the fifth episode started on version 1 (it waits for its permit) and keeps it: both are held
        assert actor.versions.held_versions() == [1, 2]
        permits.release(2)
        _wait(lambda: receiver.spool.num_seen == 6, 60, "the sixth trajectory")
        trajs, _ = receiver.spool.read(max_records=100)
        assert len({t.episode_id for t in trajs}) == 6 and receiver.stats["stored"] == 4
        assert [t.policy_version for t in trajs] == [1, 1, 1, 1, 1, 2]
        assert all(t.reward == -1.0 and t.reward_details["status"] == "compile_error" for t in trajs)
    finally:
        stop.set()
        permits.release(10)
        thread.join(60)
        outbox.close()
        fetcher.close()
        learner_down(receiver, publisher)
