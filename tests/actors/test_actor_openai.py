"""The OpenAI-compatible policy (evaluation mode) against a local test double of the endpoint: the same agent
loop, tools and sandbox; per-task results written; structured tool calls, retries and refusals."""

from __future__ import annotations

import json

from _helpers import KERNEL, MODEL_NEW, call, make_task, stages_for_tests, write
from _openai_double import ChatCompletionsDouble
from actors.actor import Actor, ResultWriter, repeat_tasks, run_actor
from actors.config import ActorConfig, AgentConfig
from actors.openai_policy import OpenAIPolicy
from actors.sandbox_stages import SandboxStages
from actors.weights import PolicyVersions
from learner.chat import ChatFormat

SOLUTION = write("kernels/chain.cpp", KERNEL) + "\n" + write("model_new.py", MODEL_NEW)
SCRIPTS = {
    "endpoint": ["Plan: one fused pass.\n" + SOLUTION,
                 {"content": "Let me build it.", "tool_calls": [("compile", {})]},
                 call("finish")],
    "flaky": [{"status": 500}, {"status": 503}, SOLUTION + "\n" + call("finish")],
    "refused": [{"status": 400, "always": True}],
}


def test_openai_policy_runs_the_agent_loop_and_writes_per_task_results(tokenizer, sandbox_client, tmp_path):
    chat = ChatFormat(tokenizer)
    out = tmp_path / "results.jsonl"
    with ChatCompletionsDouble(SCRIPTS) as double:
        policy = OpenAIPolicy(double.url, "test-model", chat, api_key="sk-test", backoff_s=0.05, retries=2)
        cfg = ActorConfig(actor_id="eval", concurrent_episodes=3,
                          agent=AgentConfig(max_turns=4, max_new_tokens_per_turn=2048, temperature=0.2,
                                            max_context_tokens=16000, solution_format="cpu"))
        actor = Actor(cfg, chat, SandboxStages(sandbox_client, stages_for_tests(priority=0)), PolicyVersions(policy),
                      ResultWriter(out), "cpu")
        summary = run_actor(actor, repeat_tasks([make_task(n) for n in SCRIPTS]))
    rows = {r["task_name"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert summary["episodes"] == 3 and len(rows) == 3

    ok = rows["endpoint"]
    assert ok["status"] == "finished" and ok["policy"] == "openai:test-model" and ok["policy_version"] == -1
    assert ok["final"]["status"] == "ok" and ok["reward"] == ok["final"]["milestone"] >= 0
    assert [t["tool"] for t in ok["tools"]] == ["write_file", "write_file", "compile", "finish"]
    assert ok["tools"][2]["status"] == "ok" and ok["files"]["model_new.py"] == MODEL_NEW

    flaky = rows["flaky"]
    assert flaky["status"] == "finished" and flaky["final"]["status"] == "ok" and policy.stats["retries"] >= 2
    refused = rows["refused"]
    assert refused["status"] == "policy_error" and "HTTP 400" in refused["error"] and refused["reward"] == -1.0

    # what the endpoint saw: our system prompt, the task, earlier replies, tool results folded into user turns
    turn3 = [r["body"] for r in double.requests if r["body"]["messages"][1]["content"].startswith("Task fused_chain: "
                                                                                                  "endpoint")][-1]
    roles = [m["role"] for m in turn3["messages"]]
    assert roles == ["system", "user", "assistant", "user", "assistant", "user"]
    assert "<tool_call>" in turn3["messages"][0]["content"] and turn3["model"] == "test-model"
    assert turn3["messages"][3]["content"].count("<tool_response>") == 2  # two write_file results, one turn
    assert turn3["messages"][4]["content"].startswith("Let me build it.\n<tool_call>\n{\"name\": \"compile\"")
    assert turn3["messages"][5]["content"].startswith("<tool_response>\ncompile: ok")
    assert turn3["temperature"] == 0.2 and turn3["max_tokens"] <= 2048
    assert {r["auth"] for r in double.requests} == {"Bearer sk-test"}

