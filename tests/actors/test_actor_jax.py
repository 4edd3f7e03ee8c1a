"""A tiny randomly initialised JAX model runs real episodes: weights from a real learner-side publisher,
trajectories to a real receiver, the final workspace scored by a real sandbox node; the actor moves from
weights version 1 to 2 while episodes run, and every trajectory's behaviour log-probs are those of the
version it records (recomputed with the learner's full forward)."""

from __future__ import annotations

import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from _helpers import free_port, make_task, stages_for_tests
from actors.actor import Actor, TrajectorySink, run_actor
from actors.config import ActorConfig, AgentConfig
from actors.policy import jax_policy_from_update
from actors.sampler import SamplerConfig
from actors.sandbox_stages import SandboxStages
from actors.weights import PolicyVersions, WeightsRefresher, model_from_tensors, random_policy_tensors
from learner.chat import ChatFormat
from learner.model import ModelConfig, token_logprobs
from protocol.trajectory_channel import TrajectoryOutbox, TrajectoryReceiver
from protocol.weights_channel import WeightsFetcher, WeightsPublisher

PAD = 1024  # learner-side recomputation pads every sequence to this length (one compilation)
SAMPLER_CONFIG = SamplerConfig(min_prompt_bucket=256, min_cache_bucket=512, min_batch_bucket=4, max_cache_len=PAD,
                               decode_chunk_steps=8)


@jax.jit
def _logits(state, graphdef_holder, tokens):
    del graphdef_holder
    model = nnx.merge(_GRAPHDEF[0], state)
    pos = jnp.broadcast_to(jnp.arange(tokens.shape[1], dtype=jnp.int32)[None], tokens.shape)
    return model(tokens, pos)


_GRAPHDEF: list = []


def learner_logprobs(model, tokens: np.ndarray) -> np.ndarray:
    """log p(tokens[t] | tokens[:t]) under `model` for t >= 1 (0 at t = 0), by one full forward, temperature 1."""
    graphdef, state = nnx.split(model)
    _GRAPHDEF[:] = [graphdef]
    padded = np.zeros((1, PAD), np.int32)
    padded[0, :len(tokens)] = tokens
    logits = _logits(state, 0, jnp.asarray(padded))[:, :len(tokens)]
    lp = token_logprobs(logits[:, :-1], jnp.asarray(tokens[None, 1:]), 1.0)
    return np.concatenate([[0.0], np.asarray(lp[0])])


@pytest.mark.slow
def test_tiny_jax_model_runs_episodes_across_a_weights_refresh(tokenizer, sandbox_client, tmp_path):
    cfg = ModelConfig.tiny(vocab_size=tokenizer.vocab_size)
    weights = {v: random_policy_tensors(cfg, seed=v, std=0.08) for v in (1, 2)}
    traj_ep, weights_ep = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    receiver = TrajectoryReceiver(traj_ep, tmp_path / "spool").start()
    publisher = WeightsPublisher(weights_ep, chunk_bytes=64 << 10).start()
    publisher.publish(1, weights[1])

    sampler_config = SAMPLER_CONFIG
    fetcher = WeightsFetcher(weights_ep, actor_id="jax-actor", timeout_s=2.0)
    refresher = WeightsRefresher(fetcher, lambda u: jax_policy_from_update(u, cfg, sampler_config, tokenizer.decode,
                                                                           seed=7))
    outbox = TrajectoryOutbox(traj_ep, actor_id="jax-actor")
    agent = AgentConfig(skill="brief", max_turns=2, max_new_tokens_per_turn=12, min_new_tokens_per_turn=4,
                        max_context_tokens=PAD - 1, solution_format="cpu")
    config = ActorConfig(actor_id="jax-actor", concurrent_episodes=3, weights_poll_s=0.2, agent=agent)
    actor = Actor(config, ChatFormat(tokenizer), SandboxStages(sandbox_client, stages_for_tests()), PolicyVersions(),
                  TrajectorySink(outbox, "jax-actor"), "cpu", refresher=refresher)
    def tasks():
        """Three episodes, then (once version 2 is in) four more: the refresh lands between episodes."""
        for _ in range(3):
            yield make_task()
        while actor.versions.newest_version < 2:
            yield None
        for _ in range(4):
            yield make_task()

    summary: dict = {}
    thread = threading.Thread(target=lambda: summary.update(run_actor(actor, tasks())), daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 300
        while actor.versions.newest_version < 1 and thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        publisher.publish(2, weights[2])  # while the first episodes run on version 1
        thread.join(300)
        assert not thread.is_alive(), "the actor did not finish its episodes"
        assert outbox.flush(30)
    finally:
        outbox.close()
        fetcher.close()
        publisher.close()
    trajs, _ = receiver.spool.read(max_records=100)
    receiver.close()

    assert summary["episodes"] == 7 and summary["episode_crashes"] == 0 and len(trajs) == 7
    versions = [t.policy_version for t in trajs]
    assert sorted(versions) == [1, 1, 1, 2, 2, 2, 2] and summary["weights_swaps"] == 1
    assert summary["batcher"]["max_batch_seen"] >= 2  # concurrent episodes shared sampler calls
    models = {v: model_from_tensors(cfg, weights[v]) for v in (1, 2)}
    for t in trajs:
        assert t.actor_id == "jax-actor" and t.reward == -1.0  # random text: nothing to build, scored all the same
        assert t.reward_details["status"] in ("compile_error", "load_error", "forbidden")
        assert t.episode_stats["status"] in ("finished", "max_turns", "context_exhausted")
        sampled = t.loss_mask.astype(bool)
        assert sampled.sum() == t.episode_stats["sampled_tokens"] > 0
        assert len(t.turn_boundaries) == t.episode_stats["turns"]
        own = learner_logprobs(models[t.policy_version], t.tokens)
        other = learner_logprobs(models[3 - t.policy_version], t.tokens)
        assert np.abs(own[sampled] - t.behaviour_logprobs[sampled]).max() < 1e-3
        assert np.abs(other[sampled] - t.behaviour_logprobs[sampled]).max() > 0.05
        assert np.all(t.behaviour_logprobs[~sampled] == 0)


@pytest.mark.slow
def test_evaluation_mode_with_a_frozen_checkpoint_writes_per_task_results(tokenizer, sandbox_client, tmp_path):
    import json

    from actors.actor import ResultWriter, repeat_tasks
    from actors.policy import jax_policy_from_checkpoint
    from actors.weights import policy_tensors
    from learner.hf_checkpoint import save_pretrained

    cfg = ModelConfig.tiny(vocab_size=tokenizer.vocab_size)
    model = model_from_tensors(cfg, random_policy_tensors(cfg, seed=11, std=0.08))
    save_pretrained(model, tmp_path / "ckpt", dtype="float32")
    tokenizer.save(tmp_path / "ckpt" / "tokenizer.json")
    policy = jax_policy_from_checkpoint(tmp_path / "ckpt", SAMPLER_CONFIG, detokenize=tokenizer.decode, seed=1)
    saved = policy_tensors(model)
    params = policy.sampler.params  # the weights the sampler actually uses
    assert np.array_equal(np.asarray(params["embed"]), saved["backbone/embed"])
    assert np.array_equal(np.asarray(params["head"]), saved["lm_head"])
    assert np.array_equal(np.asarray(params["layers"][1]["wq"]), saved["backbone/layers/wq"][1])
    agent = AgentConfig(skill="brief", max_turns=2, max_new_tokens_per_turn=8, min_new_tokens_per_turn=4,
                        max_context_tokens=PAD - 1, solution_format="cpu")
    out = tmp_path / "results.jsonl"
    actor = Actor(ActorConfig(actor_id="eval", concurrent_episodes=2, agent=agent), ChatFormat(tokenizer),
                  SandboxStages(sandbox_client, stages_for_tests(priority=0)), PolicyVersions(policy),
                  ResultWriter(out), "cpu")
    summary = run_actor(actor, repeat_tasks([make_task("a", "t_a"), make_task("b", "t_b")], samples_per_task=2))
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert summary["episodes"] == 4 and len(rows) == 4 and sorted(r["task_id"] for r in rows) == ["t_a"] * 2 + ["t_b"] * 2
    for r in rows:
        assert r["policy"] == f"checkpoint:{tmp_path / 'ckpt'}" and r["policy_version"] == 0
        assert r["status"] in ("finished", "max_turns", "context_exhausted") and r["reward"] == -1.0
        assert r["final"]["status"] in ("compile_error", "load_error", "forbidden") and r["stats"]["sampled_tokens"] > 0
