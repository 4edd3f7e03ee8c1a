"""Scripted-policy episodes through a real sandbox node on the CPU backend: rewards, statuses, observations,
loss masks and token bookkeeping; single-turn mode, limits, and the "best workspace" reward option."""

from __future__ import annotations

import numpy as np
import pytest

from _helpers import (BROKEN_KERNEL, HOSTILE_KERNEL, KERNEL, MODEL_NEW, WRONG_KERNEL, ScriptedPolicy, call,
                      make_task, stages_for_tests, write)
from actors.actor import Actor, run_actor
from actors.config import ActorConfig, AgentConfig
from actors.sandbox_stages import SandboxStages
from actors.weights import PolicyVersions
from learner.chat import ChatFormat

SOLUTION = write("kernels/chain.cpp", KERNEL) + "\n" + write("model_new.py", MODEL_NEW)

SCRIPTS = {
    "correct": ["I will fuse the chain into one pass.\n" + SOLUTION, call("compile"), call("verify"), call("profile"),
                call("finish")],
    "wrong": [write("kernels/chain.cpp", WRONG_KERNEL) + "\n" + write("model_new.py", MODEL_NEW) + "\n" + call("verify"),
              call("finish")],
    "malformed": ['<tool_call>\n{"name": "write_file", "arguments": {"path": "model_new.py",}}\n</tool_call>',
                  call("run_shell", cmd="cat /etc/passwd"),
                  write("model.py", "x") + "\n" + write("../../etc/cron.d/x", "y") + "\n" + write("kernels/a.py", "z"),
                  "I think I am done.",
                  write("kernels/chain.cpp", BROKEN_KERNEL) + "\n" + write("model_new.py", MODEL_NEW) + "\n"
                  + call("compile"),
                  SOLUTION + "\n" + call("finish")],
    "hostile": [write("kernels/chain.cpp", HOSTILE_KERNEL) + "\n" + write("model_new.py", MODEL_NEW) + "\n"
                + call("compile"), call("finish")],
}


class ListSink:
    def __init__(self):
        self.episodes = []

    def put(self, episode):
        self.episodes.append(episode)


def run_episodes(tokenizer, client, scripts, names=None, concurrent=4, **agent):
    policy = ScriptedPolicy(tokenizer, scripts)
    agent = {"max_turns": 8, "max_context_tokens": 16000, "solution_format": "cpu", **agent}
    cfg = ActorConfig(concurrent_episodes=concurrent, actor_id="test-actor", agent=AgentConfig(**agent))
    sink = ListSink()
    actor = Actor(cfg, ChatFormat(tokenizer), SandboxStages(client, stages_for_tests()), PolicyVersions(policy), sink,
                  "cpu")
    summary = run_actor(actor, [make_task(n) for n in (names or scripts)])
    return {e.task.name: e for e in sink.episodes}, summary, policy


def check_token_record(ep, chat):
    """The trajectory's tokens decode to the rendered conversation; the loss mask is exactly the sampled tokens."""
    tok = chat.tokenizer
    assert tok.decode(ep.tokens.tolist()) == tok.decode(chat.render(ep.messages).ids.tolist())
    assert chat.parse(ep.tokens.tolist()) == ep.messages
    assistant = [m.content for m in ep.messages if m.role == "assistant"]
    assert len(ep.turn_starts) == len(assistant) == ep.stats["turns"]
    covered = np.zeros(len(ep.tokens), bool)
    for start, content in zip(ep.turn_starts, assistant):
        n = len(tok.encode(content)) + 1  # the scripted policy samples the text's tokens and <|im_end|>
        assert tok.decode(ep.tokens[start:start + n].tolist()) == content + "<|im_end|>"
        gen = chat.generation_prompt()
        assert ep.tokens[start - len(gen):start].tolist() == gen
        covered[start:start + n] = True
    assert np.array_equal(ep.loss_mask.astype(bool), covered)
    assert np.all(ep.logprobs[covered] == np.float32(-0.25)) and np.all(ep.logprobs[~covered] == 0)
    traj = ep.trajectory("test-actor")
    assert traj.loss_mask.dtype == np.uint8 and traj.turn_boundaries.tolist() == ep.turn_starts
    assert traj.policy_version == 1 and traj.reward == ep.reward and traj.num_tokens == len(ep.tokens)


def test_scripted_episodes_get_the_right_rewards_masks_and_observations(tokenizer, sandbox_client):
    chat = ChatFormat(tokenizer)
    eps, summary, policy = run_episodes(tokenizer, sandbox_client, SCRIPTS)
    assert summary["episodes"] == 4 and summary["episode_crashes"] == 0
    assert {n: e.status for n, e in eps.items()} == dict.fromkeys(SCRIPTS, "finished")
    assert max(policy.calls) >= 2, "concurrent episodes were never batched into one sampler call"
    assert summary["time"]["sampling_s"] > 0 and summary["time"]["sandbox_s"] > 0

    good = eps["correct"]
    assert good.final.status == "ok" and good.reward == good.final.timing.milestone >= 0
    assert [t["tool"] for t in good.tool_log] == ["write_file", "write_file", "compile", "verify", "profile", "finish"]
    obs = [m.content for m in good.messages if m.role == "tool"]
    assert obs[2].startswith("compile: ok") and obs[3].startswith("verify: PASS: correct on ")
    assert obs[4].startswith("profile: reward") and "speed-up vs eager" in obs[4] and "yours" in obs[4]

    wrong = eps["wrong"]
    assert wrong.reward == -1.0 and wrong.final.status == "incorrect"
    verify = [m.content for m in wrong.messages if m.role == "tool"][-1]
    assert verify.startswith("verify: INCORRECT") and "trial 0: FAIL (" in verify and "max abs err" in verify

    bad = eps["malformed"]
    assert bad.final.status == "ok" and bad.reward == bad.final.timing.milestone
    assert (bad.stats["malformed_turns"], bad.stats["unknown_tools"], bad.stats["refused_writes"],
            bad.stats["no_call_turns"]) == (1, 1, 3, 1)
    texts = [m.content for m in bad.messages[2:] if m.role != "assistant"]
    assert texts[0].startswith("error: malformed tool call: tool call 1: not valid JSON")
    assert texts[1].startswith("error: unknown tool 'run_shell'")
    assert "model.py is the reference and is read-only" in texts[2]
    assert "'../../etc/cron.d/x' is outside the workspace" in texts[3] and "must end in one of" in texts[4]
    assert texts[5].startswith("Your reply has no tool call")
    assert texts[8].startswith("compile: COMPILE_ERROR") and "error:" in texts[8] and "flot" in texts[8]
    assert bad.files == {"kernels/chain.cpp": KERNEL, "model_new.py": MODEL_NEW}

    hostile = eps["hostile"]
    assert hostile.reward == -1.0 and hostile.final.status == "forbidden"
    assert "calls system" in [m.content for m in hostile.messages if m.role == "tool"][-1]

    for ep in eps.values():
        check_token_record(ep, chat)
        assert ep.trainable and ep.reward_details()["status"] == ep.final.status


def test_single_turn_and_the_episode_limits(tokenizer, sandbox_client):
    chat = ChatFormat(tokenizer)
    single, _, _ = run_episodes(tokenizer, sandbox_client, {"one shot": [SOLUTION]}, mode="single_turn")
    ep = single["one shot"]
    assert ep.status == "finished" and ep.stats["turns"] == 1 and ep.final.status == "ok"
    offered = ep.messages[0].content
    assert '"name": "write_file"' in offered and '"name": "compile"' not in offered  # only write_file is offered
    check_token_record(ep, chat)

    looping, _, _ = run_episodes(tokenizer, sandbox_client, {"looping": [call("list_files")]}, max_turns=3)
    ep = looping["looping"]
    assert ep.status == "max_turns" and ep.stats["turns"] == 3 and ep.reward == -1.0
    assert ep.final.status == "compile_error" and "model_new.py" in ep.final.message  # empty workspace, still scored
    check_token_record(ep, chat)

    prompt_len = len(chat.render(run_prompt_messages(tokenizer), add_generation_prompt=True).ids)
    long_reply = [SOLUTION + "\n" + call("finish")]
    cut, _, _ = run_episodes(tokenizer, sandbox_client, {"long": long_reply}, max_context_tokens=prompt_len + 60,
                             min_new_tokens_per_turn=16)
    ep = cut["long"]
    assert ep.status == "context_exhausted" and ep.stats["turns"] == 0 and not ep.loss_mask.any()
    assert len(ep.tokens) == prompt_len - len(chat.generation_prompt())  # the unsampled generation prompt is dropped
    assert ep.final is not None and ep.reward == -1.0

    late, _, _ = run_episodes(tokenizer, sandbox_client, {"late": [call("list_files")]}, episode_time_s=1e-6)
    assert late["late"].status == "time_limit" and late["late"].stats["turns"] == 0


def run_prompt_messages(tokenizer):
    from actors.skill import system_prompt, task_prompt
    from learner.chat import Message

    return [Message("system", system_prompt("cpu", "multi_turn", 8)), Message("user", task_prompt(make_task("long"), "cpu"))]


@pytest.mark.parametrize("reward_from", ["final", "best"])
def test_reward_from_the_final_or_the_best_workspace(tokenizer, sandbox_client, reward_from):
    script = {"regress": [SOLUTION, call("profile"),
                          write("kernels/chain.cpp", WRONG_KERNEL) + "\n" + call("finish")]}
    eps, _, _ = run_episodes(tokenizer, sandbox_client, script, reward_from=reward_from)
    ep = eps["regress"]
    profiled = ep.tool_log[2]
    assert profiled["tool"] == "profile" and profiled["ok"] and ep.final.status == "incorrect"
    if reward_from == "final":
        assert ep.reward == -1.0 and ep.reward_source == "final"
    else:
        assert ep.reward == profiled["reward"] >= 0 and ep.reward_source == "best (profile at turn 1)"


def test_staleness_control_keeps_an_actor_one_batch_ahead_of_the_learner(tokenizer, sandbox_client):
    # On the H200 two actors sampled 2,756 episodes while the learner ran its first update on 32 (every one past
    # the staleness bound's use, and all of it GPU time taken from the learner). With a share of 3 a version and 1
    # version ahead, an actor holding version v starts (v - v0 + 2) * 3 episodes, then waits for newer weights.
    import threading
    import time

    from actors.actor import cycle_tasks

    class Sink:
        def __init__(self):
            self.versions = []

        def put(self, ep):
            self.versions.append(ep.policy_version)

    def wait_for(n: int) -> None:
        deadline = time.monotonic() + 60
        while len(sink.versions) < n:
            assert time.monotonic() < deadline, f"only {len(sink.versions)} of {n} episodes in 60 s"
            time.sleep(0.02)

    sink = Sink()
    versions = PolicyVersions(ScriptedPolicy(tokenizer, {"quota": ["no code at all"]}, version=0))
    cfg = ActorConfig(concurrent_episodes=2, episodes_per_version=3, versions_ahead=1, failure_backoff_s=0,
                      agent=AgentConfig(mode="single_turn", solution_format="cpu"))
    actor = Actor(cfg, ChatFormat(tokenizer), SandboxStages(sandbox_client, stages_for_tests()), versions, sink, "cpu")
    stop = threading.Event()
    out: dict = {}
    thread = threading.Thread(target=lambda: out.update(run_actor(actor, cycle_tasks([make_task("quota")]),
                                                                  stop=stop)), daemon=True)
    thread.start()
    try:
        wait_for(6)
        time.sleep(1.0)  # each episode takes milliseconds (an empty workspace): a leak would show hundreds here
        assert sink.versions == [0] * 6 and actor.stats["quota_holds"] == 1
        versions.set(ScriptedPolicy(tokenizer, {"quota": ["no code at all"]}, version=1))
        wait_for(9)
        time.sleep(1.0)
        assert sink.versions == [0] * 6 + [1] * 3 and actor.stats["quota_holds"] == 2
    finally:
        stop.set()
        thread.join(60)
    assert out["quota_holds"] == 2 and out["quota_overrides"] == 0 and out["by_status"] == {"finished": 9}

    # the liveness valve: a hold older than quota_max_wait_s lets one more share start (a learner that refused
    # trajectories must not wait forever for a batch)
    actor._quota_hold = (1, time.monotonic() - cfg.quota_max_wait_s - 1)
    assert actor._within_quota() and actor.stats["quota_overrides"] == 1
    actor._quota_used += 3
    assert not actor._within_quota()  # the extra share is used up: holding again
    # while episodes of its own are still running the valve's clock restarts: their trajectories may yet
    # complete the learner's batch, so no extra share starts however long they take
    actor._quota_hold = (1, time.monotonic() - cfg.quota_max_wait_s - 1)
    assert not actor._within_quota(busy=True) and actor.stats["quota_overrides"] == 1
    assert time.monotonic() - actor._quota_hold[1] < 1.0
    assert not actor._within_quota()  # idle now, but the clock started again
    actor._quota_hold = (1, time.monotonic() - cfg.quota_max_wait_s - 1)
    assert actor._within_quota() and actor.stats["quota_overrides"] == 2


def test_staleness_control_does_not_count_episodes_that_never_reach_the_learner(tokenizer):
    from sandbox.client import SandboxClient

    class Broken:
        version, name = 0, "broken"

        def generate(self, prompts, settings):
            raise FloatingPointError("sampler: non-finite behaviour log-probs")

    class Sink:
        def __init__(self):
            self.n = 0

        def put(self, ep):
            self.n += 1

    with SandboxClient(["tcp://127.0.0.1:9"]) as client:  # never asked: the policy fails first
        cfg = ActorConfig(concurrent_episodes=1, episodes_per_version=2, failure_backoff_s=0,
                          agent=AgentConfig(mode="single_turn", solution_format="cpu"))
        sink = Sink()
        actor = Actor(cfg, ChatFormat(tokenizer), SandboxStages(client, stages_for_tests()),
                      PolicyVersions(Broken()), sink, "cpu")
        summary = run_actor(actor, [make_task("a")] * 7)
    # 7 policy_error episodes, more than the 4 the share allows: none of them took a place in it
    assert summary["by_status"] == {"policy_error": 7} and summary["quota_holds"] == 0 and actor._quota_used == 0


@pytest.mark.parametrize("status", ["finished", "policy_error"])
def test_a_refused_handover_gives_back_its_place_in_the_share_once(tokenizer, sandbox_client, status):
    """An episode the sink refuses never reaches the learner: its place in the share goes back, and an untrainable
    one (whose place went back when it ended) does not give it back twice (the share would grow without bound)."""
    class Policy:
        version, name = 0, "p"

        def generate(self, prompts, settings):
            raise FloatingPointError("sampler: non-finite behaviour log-probs")

    class RefusingSink:
        def put(self, ep):
            raise ValueError("the protocol refuses this trajectory")

    cfg = ActorConfig(concurrent_episodes=1, episodes_per_version=2, failure_backoff_s=0,
                      agent=AgentConfig(mode="single_turn", solution_format="cpu"))
    policy = ScriptedPolicy(tokenizer, {"a": ["no code at all"]}, version=0) if status == "finished" else Policy()
    actor = Actor(cfg, ChatFormat(tokenizer), SandboxStages(sandbox_client, stages_for_tests()),
                  PolicyVersions(policy), RefusingSink(), "cpu")
    summary = run_actor(actor, [make_task("a")] * 5)
    assert summary["by_status"] == {status: 5} and actor.stats["sink_errors"] == 5
    assert actor._quota_used == 0 and summary["quota_holds"] == 0


def test_verify_on_finish_refuses_a_failing_finish_while_turns_remain(tokenizer, sandbox_client):
    """AgentConfig.verify_on_finish: a finish whose verification fails is refused with the verify observation and
    the episode goes on (the policy fixes its kernel); on the last turn the finish stands and the reward is the
    final evaluation's; off (the default) the first finish ends the episode."""
    chat = ChatFormat(tokenizer)
    wrong = write("kernels/chain.cpp", WRONG_KERNEL) + "\n" + write("model_new.py", MODEL_NEW) + "\n" + call("finish")
    scripts = {"fixes": [wrong, SOLUTION + "\n" + call("finish")], "last turn": [wrong, wrong]}
    eps, _, _ = run_episodes(tokenizer, sandbox_client, scripts, verify_on_finish=True, max_turns=2)

    fixes = eps["fixes"]
    assert fixes.status == "finished" and fixes.final.status == "ok" and fixes.reward >= 0
    assert fixes.stats["refused_finishes"] == 1 and fixes.stats["turns"] == 2
    refused = [t for t in fixes.tool_log if t["tool"] == "finish"]
    assert [t["ok"] for t in refused] == [False, True] and refused[0]["status"] == "incorrect"
    obs = [m.content for m in fixes.messages if m.role == "tool"][-1]
    assert obs.startswith("finish: refused, the solution fails verification")
    assert "verify: INCORRECT" in obs and "trial 0: FAIL (" in obs
    check_token_record(fixes, chat)

    last = eps["last turn"]  # the second finish is on the last turn: accepted unchecked, the final check gives -1
    assert last.status == "finished" and last.final.status == "incorrect" and last.reward == -1.0
    assert last.stats["refused_finishes"] == 1 and last.stats["turns"] == 2

    off, _, _ = run_episodes(tokenizer, sandbox_client, {"fixes": scripts["fixes"]}, max_turns=2)
    assert off["fixes"].stats["turns"] == 1 and off["fixes"].final.status == "incorrect"
    assert off["fixes"].stats["refused_finishes"] == 0


def test_rft_repair_sequences_from_real_episodes(tokenizer, sandbox_client):
    """stages.rft.repair_per_task: a failed and a correct single-turn episode of one task (real sandbox results)
    become a two-turn multi-turn chat: the failed reply and finish, the refusal verify_on_finish gives quoting the
    failed episode's real verify observation, the correct reply and finish; the loss is on the repair turn only."""
    from cuda_agent.config import load_config
    from cuda_agent.stage_worker import repair_sequences
    from cuda_agent.train_config import TrainConfig

    chat = ChatFormat(tokenizer)
    wrong = write("kernels/chain.cpp", WRONG_KERNEL) + "\n" + write("model_new.py", MODEL_NEW)
    eps, _, _ = run_episodes(tokenizer, sandbox_client, {"wrong": [wrong], "correct": [SOLUTION]}, mode="single_turn")
    assert eps["wrong"].final.status == "incorrect" and eps["correct"].final.status == "ok"
    obs = eps["wrong"].reward_details()["observation"]
    assert obs.startswith("verify: INCORRECT") and "trial 0: FAIL (" in obs
    assert "observation" not in eps["correct"].reward_details()
    task = make_task("wrong")
    trajs = [eps["wrong"].trajectory("a"), eps["correct"].trajectory("a")]  # one task id: the names differ only
    assert {t.task_id for t in trajs} == {task.id}

    cfg = load_config(TrainConfig, None, ["stages.rft.repair_per_task=2"])
    seqs, info = repair_sequences(cfg, chat, trajs, [task], "cpu")
    assert info["data/repair_pairs"] == 1 and info["data/repair_sequences"] == 1 and len(seqs) == 1
    s = seqs[0]
    msgs = chat.parse(s.tokens.tolist())
    assert [m.role for m in msgs] == ["system", "user", "assistant", "tool", "assistant"]
    assert msgs[2].content.startswith(wrong) and msgs[2].content.endswith(call("finish"))
    assert msgs[3].content == "finish: refused, the solution fails verification; fix it and call finish again.\n" + obs
    assert msgs[4].content == SOLUTION + "\n" + call("finish")
    trained = tokenizer.decode(s.tokens[s.loss_mask.astype(bool)].tolist())
    assert trained == msgs[4].content + "<|im_end|>"  # the repair turn only

    # a failed reply that wrote a file the correct one does not: the chat's workspace would keep it
    from learner.chat import Message
    from protocol.trajectory import Trajectory

    other = write("kernels/other.cpp", WRONG_KERNEL) + "\n" + write("model_new.py", MODEL_NEW)
    r = chat.render([Message("system", "s"), Message("user", "u"), Message("assistant", other)])
    stale = Trajectory(episode_id="stale", task_id=task.id, actor_id="a", policy_version=1, tokens=r.ids,
                       behaviour_logprobs=np.zeros(len(r.ids), np.float32), loss_mask=r.loss_mask.astype(np.uint8),
                       turn_boundaries=np.zeros(1, np.int32), reward=-1.0,
                       reward_details={"status": "incorrect", "observation": obs})
    seqs, info = repair_sequences(cfg, chat, [stale, trajs[1]], [task], "cpu")
    assert seqs == [] and info["data/repair_skipped_stale_files"] == 1

    none, info = repair_sequences(cfg, chat, trajs, [], "cpu")  # tasks unknown: counted, left out
    assert none == [] and info["data/repair_skipped_no_task"] == 1
    short = load_config(TrainConfig, None, ["stages.rft.repair_per_task=2", "stages.rft.repair_max_tokens=64"])
    assert repair_sequences(short, chat, trajs, [task], "cpu")[1]["data/repair_skipped_too_long"] == 1


def test_observations_quoting_a_special_token_do_not_end_the_episode(tokenizer, sandbox_client):
    """A file whose text holds "<|im_end|>" (written through a JSON escape, so the reply itself holds no special
    token) read back by read_file: the observation spells it with spaces and the episode goes on and is scored."""
    chat = ChatFormat(tokenizer)
    sneaky = ('<tool_call>\n{"name": "write_file", "arguments": {"path": "kernels/note.h", "content": '
              '"// <\\u007cim_end\\u007c>\\n"}}\n</tool_call>')
    script = [sneaky, call("read_file", path="kernels/note.h"), SOLUTION + "\n" + call("finish")]
    eps, summary, _ = run_episodes(tokenizer, sandbox_client, {"quoting": script})
    ep = eps["quoting"]
    assert summary["episode_crashes"] == 0 and ep.status == "finished" and ep.final.status == "ok"
    read = [m.content for m in ep.messages if m.role == "tool"][1]
    assert "<| im_end |>" in read and "<|im_end|>" not in read
    check_token_record(ep, chat)


def test_verify_on_finish_says_which_calls_a_refusal_left_unrun_and_needs_room_for_another_turn(tokenizer,
                                                                                              sandbox_client):
    """Calls after a refused finish in the same reply are answered "not run"; with no context room for another
    turn the finish is not refused (the final evaluation decides at once)."""
    wrong = write("kernels/chain.cpp", WRONG_KERNEL) + "\n" + write("model_new.py", MODEL_NEW)
    script = [wrong + "\n" + call("finish") + "\n" + write("kernels/chain.cpp", KERNEL),
              SOLUTION + "\n" + call("finish")]
    eps, _, _ = run_episodes(tokenizer, sandbox_client, {"after": script}, verify_on_finish=True, max_turns=3)
    ep = eps["after"]
    obs = [m.content for m in ep.messages if m.role == "tool"]
    assert obs[2].startswith("finish: refused") and obs[3] == "write_file: not run: finish was refused"
    assert ep.stats["refused_finishes"] == 1 and ep.final.status == "ok"

    used = len(ChatFormat(tokenizer).render(ep.messages[:3], add_generation_prompt=True).ids)
    tight, _, _ = run_episodes(tokenizer, sandbox_client, {"after": script}, verify_on_finish=True, max_turns=3,
                               max_context_tokens=used + 80, min_new_tokens_per_turn=64)
    assert tight["after"].stats["refused_finishes"] == 0 and tight["after"].final.status == "incorrect"
