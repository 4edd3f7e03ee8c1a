"""The offline stages' learning-rate plan (cuda_agent.stage_worker): fitted to the time budget at the measured
step time, so a stage cut by its budget still ends annealed; a re-planned schedule keeps the optimiser state."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from cuda_agent.stage_worker import REPLAN_EVERY, fitted_steps


def test_plan_shrinks_to_the_budget_and_grows_back_to_the_stage_limit():
    # 450 planned, 12 done at 1.5 s/step with 400 s left: 266 more fit
    assert fitted_steps(12, 450, 450, 1.5, 400.0) == 12 + 266
    # the machine got faster: the plan grows, never past the stage's own steps
    assert fitted_steps(100, 278, 450, 0.5, 400.0) == 450
    assert fitted_steps(100, 278, 450, 1.0, 250.0) == 350


def test_plan_is_kept_when_close_or_nearly_done():
    assert fitted_steps(50, 300, 450, 1.0, 255.0) is None  # 305 vs 300: within the tolerance
    assert fitted_steps(300 - REPLAN_EVERY + 1, 300, 450, 1.0, 5.0) is None  # the plan ends within a check
    assert fitted_steps(10, 300, 450, 1.0, -3.0) == 11  # budget already spent: one more step, the loop's guard ends it


def test_replanned_schedule_keeps_the_optimiser_state_and_anneals():
    from learner.config import OptimizerConfig
    from learner.model import ModelConfig, Transformer
    from learner.train_step import SequenceBatch, create_train_state, make_optimizer, sft_train_step

    cfg = ModelConfig(vocab_size=64, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=8,
                            intermediate_size=32, max_position_embeddings=64)
    net = Transformer(cfg, nnx.Rngs(params=jax.random.key(0)))
    opt = OptimizerConfig(lr=1e-2, warmup_steps=2, decay_steps=98, schedule="cosine", end_lr_ratio=0.1)
    state = create_train_state(net, opt)
    toks = jnp.asarray(np.random.default_rng(0).integers(0, 64, (1, 2, 16)), jnp.int32)
    pos = jnp.broadcast_to(jnp.arange(16, dtype=jnp.int32), toks.shape)
    batch = SequenceBatch(toks, pos, jnp.ones_like(toks), jnp.ones(toks.shape, jnp.float32))
    for _ in range(3):
        state, m = sft_train_step(state, batch)
    tx, sched = make_optimizer(OptimizerConfig(lr=1e-2, warmup_steps=2, decay_steps=3, schedule="cosine",
                                               end_lr_ratio=0.1))
    state = state.replace(tx=tx, lr_schedule=sched)
    for _ in range(2):
        state, m = sft_train_step(state, batch)
    assert int(state.step) == 5
    assert float(m["sft/lr"]) == pytest.approx(1e-2 * (0.1 + 0.9 * 0.5 * (1 + np.cos(np.pi * 2 / 3))), rel=1e-4)
    assert np.isfinite(float(m["sft/nll"]))


def test_stage_models_take_the_runs_numerics_not_the_checkpoints(tmp_path):
    """A stage loads the policy from a Hugging Face folder (shape only); dtype, remat and attention come from
    the run's model spec (cuda_agent.prepare.runtime_overrides). Without them the h200 preset's warm start ran
    XLA attention without remat at 8 x 8192 tokens and asked for 94.5 GiB on the H200."""
    from cuda_agent.prepare import model_config, runtime_overrides
    from cuda_agent.train_config import ModelSpec
    from learner.hf_checkpoint import load_pretrained, save_pretrained
    from learner.model import Transformer

    spec = ModelSpec(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16, intermediate_size=64,
                     dtype="bfloat16", remat=True, remat_policy="save_dots", attention_impl="chunked")
    save_pretrained(Transformer(model_config(spec, 100), nnx.Rngs(0)), tmp_path, dtype="float32")
    plain = load_pretrained(tmp_path).config
    assert (plain.remat, plain.attention_impl) == (False, "xla")  # what a stage got before
    cfg = load_pretrained(tmp_path, **runtime_overrides(spec)).config
    assert (cfg.dtype, cfg.param_dtype, cfg.remat, cfg.remat_policy, cfg.attention_impl) == (
        "bfloat16", "float32", True, "save_dots", "chunked")


def test_actors_and_evaluations_sample_with_the_runs_numerics(tmp_path):
    """The actors of a PPO stage and the run's evaluations load the same Hugging Face folder; their sampler gets the
    run's compute dtype and attention (ActorConfig.model_dtype / attention_impl), not float32 and XLA attention."""
    import types

    from actors.config import ActorConfig
    from cuda_agent.config import load_config
    from cuda_agent.ppo_stage import actor_config
    from cuda_agent.train import preset_path
    from cuda_agent.train_config import TrainConfig
    from learner.hf_checkpoint import read_config, save_pretrained
    from learner.model import ModelConfig, Transformer

    cfg = load_config(TrainConfig, preset_path("h200"), ["preset=h200"])
    acfg = actor_config(types.SimpleNamespace(cfg=cfg, fmt="cubin"), "multi_turn_ppo")
    assert acfg.model_overrides() == {"dtype": "bfloat16", "attention_impl": "cudnn"}
    save_pretrained(Transformer(ModelConfig.tiny(), nnx.Rngs(0)), tmp_path, dtype="float32")
    loaded = read_config(tmp_path, **acfg.model_overrides())
    assert (loaded.dtype, loaded.attention_impl) == ("bfloat16", "cudnn")
    assert ActorConfig().model_overrides() == {}  # unset: the checkpoint's defaults, as before
    # staleness control: each actor's share of a batch; with weights published every K updates a version stands
    # for K batches, so the actors may run K - 1 more versions' shares ahead (else they would wait for the valve)
    spec = cfg.stages.multi_turn_ppo
    assert acfg.episodes_per_version == -(-spec.episodes_per_update // cfg.actors) and acfg.versions_ahead == 1
    cfg3 = dataclasses.replace(cfg, learner=dataclasses.replace(cfg.learner, publish_every_updates=3))
    acfg3 = actor_config(types.SimpleNamespace(cfg=cfg3, fmt="cubin"), "multi_turn_ppo")
    assert acfg3.versions_ahead == 3 and acfg3.episodes_per_version == acfg.episodes_per_version
    # actor.episodes_per_version=0 switches the control off in a PPO stage too (None, the default, is automatic)
    off = dataclasses.replace(cfg, actor=dataclasses.replace(cfg.actor, episodes_per_version=0))
    acfg_off = actor_config(types.SimpleNamespace(cfg=off, fmt="cubin"), "multi_turn_ppo")
    assert acfg_off.episodes_per_version == 0 and acfg_off.versions_ahead == 1
    # a share set by the user is also one batch's: with K = 3 its actors run 2 more versions ahead (they waited for
    # the liveness valve before)
    own = dataclasses.replace(cfg3, actor=dataclasses.replace(cfg.actor, episodes_per_version=5))
    acfg_own = actor_config(types.SimpleNamespace(cfg=own, fmt="cubin"), "multi_turn_ppo")
    assert acfg_own.episodes_per_version == 5 and acfg_own.versions_ahead == 3
    with pytest.raises(ValueError, match="episodes_per_version"):
        ActorConfig(episodes_per_version=-1)
    with pytest.raises(ValueError, match="attention_impl"):
        ActorConfig(attention_impl="flash")
    with pytest.raises(ValueError, match="model_dtype"):
        ActorConfig(model_dtype="fp16")


def test_ppo_stage_schedule_spans_every_optimiser_step_of_the_stage():
    """The PPO learner's cosine runs over updates x epochs x minibatches (at most one episode a packed row): with
    4 epochs of 1-row minibatches the learning rate must not reach its floor in the stage's first updates."""
    from cuda_agent.config import load_config
    from cuda_agent.ppo_learner import learner_config
    from cuda_agent.train import preset_path
    from cuda_agent.train_config import TrainConfig
    from learner.train_step import make_optimizer

    cfg = load_config(TrainConfig, preset_path("local"), ["learner.ppo.epochs=4", "learner.ppo.minibatch_size=1",
                                                          "learner.ppo.microbatch_size=1"])
    spec = cfg.stages.single_turn_ppo
    lc = learner_config(cfg, "single_turn_ppo")
    assert (lc.ppo.epochs, lc.ppo.minibatch_size) == (4, 1)
    steps = spec.updates * 4 * spec.episodes_per_update
    assert lc.policy_optim.warmup_steps + lc.policy_optim.decay_steps == lc.critic_optim.decay_steps == steps
    assert lc.policy_optim.warmup_steps <= steps // 10
    _, sched = make_optimizer(lc.policy_optim)
    # the stage's updates at 2 packed rows each (4 episodes a row): past the warm-up, still above 90% of the peak
    # rate at the stage's last step (a bound of 4 steps an update had reached the floor halfway)
    assert float(sched(spec.updates * 4 * 2 - 1)) > 0.9 * spec.lr
    # one step an update, 3 updates (4 episodes, 1 epoch: as the preset was before session 28): no warm-up, so the
    # first update is applied at the full rate (a warm-up of `updates` steps ran it at 0)
    lc1 = learner_config(load_config(TrainConfig, preset_path("local"), [
        "stages.single_turn_ppo.episodes_per_update=4", "stages.single_turn_ppo.updates=3", "learner.ppo.epochs=1"]),
        "single_turn_ppo")
    _, sched1 = make_optimizer(lc1.policy_optim)
    assert lc1.policy_optim.warmup_steps == 0 and float(sched1(0)) == pytest.approx(spec.lr)


def test_group_baseline_needs_groups_of_episodes():
    from cuda_agent.config import load_config
    from cuda_agent.train import preset_path
    from cuda_agent.train_config import TrainConfig

    # the local preset uses the group baseline, in groups of 4
    cfg = load_config(TrainConfig, preset_path("local"))
    assert (cfg.learner.ppo.baseline, cfg.actor.group_size) == ("group", 4)
    with pytest.raises(ValueError, match="actor.group_size >= 2"):
        load_config(TrainConfig, preset_path("local"), ["actor.group_size=1"])
    # local: 32 episodes an update, multi-turn 8, one actor: groups of 3 would straddle updates
    with pytest.raises(ValueError, match=r"stages.single_turn_ppo.episodes_per_update \(32\) over 1 actor\(s\) is 32"):
        load_config(TrainConfig, preset_path("local"), ["actor.group_size=3"])
    with pytest.raises(ValueError, match="stages.multi_turn_ppo"):
        load_config(TrainConfig, preset_path("local"), ["actor.group_size=16"])
    load_config(TrainConfig, preset_path("local"), ["actor.group_size=16", "stages.multi_turn_ppo.enabled=false"])
    # the critic instead needs no groups
    load_config(TrainConfig, preset_path("local"), ["learner.ppo.baseline=critic", "actor.group_size=1"])
