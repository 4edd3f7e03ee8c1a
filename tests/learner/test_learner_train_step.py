"""Jitted policy / critic / SFT steps and the PPO update driver on a tiny real transformer (CPU)."""

from __future__ import annotations

import dataclasses
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

sys.path.insert(0, os.path.dirname(__file__))
from _rollouts import micro, multiturn_rollout, rollout_for  # noqa: E402
from _tiny_models import TINY, make_critic, make_policy  # noqa: E402

from learner import train_step as ts  # noqa: E402
from learner.model import ModelConfig, Transformer  # noqa: E402
from learner.config import OptimizerConfig, PPOConfig  # noqa: E402

T = 40
# Shared settings: each distinct static config costs a compile of the steps (~5 s of CPU each), so the tests
# reuse these. T = 40 with logits_chunk_size 16 runs the chunked output head (3 chunks, the last padded).
OPT0 = OptimizerConfig(lr=0.0, warmup_steps=0)
OPT1 = OptimizerConfig(lr=3e-2, warmup_steps=0)
CFG = PPOConfig(minibatch_size=4, microbatch_size=2, epochs=2, dual_clip_c=3.0, entropy_coef=0.01, kl_coef=0.1,
                logits_chunk_size=16)


def test_first_minibatch_ratio_is_exactly_one_at_lr_zero():
    policy = ts.create_train_state(make_policy(), OPT0, CFG)
    critic = ts.create_train_state(make_critic(), OPT0, CFG)
    ro = rollout_for(policy, 8, noise=0.3)
    # direct: proximal logprobs recomputed at update start, then one train step
    seq_m = micro(ro.seq, 4)
    prox, _ = ts.policy_logprobs(policy, seq_m)
    batch = ts.PolicyBatch(seq_m, micro(ro.behaviour_logprobs, 4), prox, micro(ro.rewards, 4))
    new, m = ts.policy_train_step(policy, _first_minibatch(batch))
    assert float(m["ppo/ratio_dev_max"]) == 0.0
    assert float(m["ppo/ratio_mean"]) == 1.0
    assert float(m["ppo/approx_kl"]) == 0.0 and float(m["ppo/clip_frac"]) == 0.0
    assert float(m["ppo/grad_norm"]) > 0  # there is a gradient; lr 0 keeps the parameters
    assert jax.tree.all(jax.tree.map(lambda a, b: bool(jnp.array_equal(a, b)), new.params, policy.params))
    # through the driver: every minibatch of every epoch keeps ratio 1 when nothing moves; with the frozen
    # reference equal to the policy, the KL term is exactly 0 too
    _, _, metrics = ts.ppo_update(policy, critic, ro, jax.random.key(0), ref_params=policy.params)
    assert metrics["ppo/ratio_dev_max"] == 0.0 and metrics["ppo/kl_ref"] == 0.0
    assert metrics["ppo/behaviour_weight_mean"] != 1.0  # the behaviour logprobs differ: w != 1


def _first_minibatch(batch: ts.PolicyBatch) -> ts.PolicyBatch:
    # the first 2 microbatches (= minibatch of 4 rows)
    return jax.tree.map(lambda x: x[:2], batch)


def test_ratio_moves_after_an_update_at_positive_lr():
    policy = ts.create_train_state(make_policy(), OPT1, CFG)
    critic = ts.create_train_state(make_critic(), OPT0, CFG)
    ro = rollout_for(policy, 8)
    _, _, metrics = ts.ppo_update(policy, critic, ro, jax.random.key(0))
    assert metrics["ppo/ratio_dev_max"] > 1e-3
    assert metrics["ppo/clip_frac"] > 0


def test_gradient_accumulation_equals_one_big_batch():
    policy = ts.create_train_state(make_policy(), OPT1, CFG)
    ro = rollout_for(policy, 4, noise=0.2)
    prox, _ = ts.policy_logprobs(policy, micro(ro.seq, 2))
    prox = prox.reshape(4, T)
    adv = jnp.asarray(np.random.default_rng(3).normal(size=(4, T)).astype(np.float32))
    ref = prox - 0.05
    full = ts.PolicyBatch(ro.seq, ro.behaviour_logprobs, prox, adv, ref)
    s1, m1 = ts.policy_train_step(policy, micro(full, 1))  # one pass of 4 rows
    s4, m4 = ts.policy_train_step(policy, micro(full, 2))  # 2 accumulated passes of 2 rows
    for k in ("ppo/policy_loss", "ppo/entropy", "ppo/kl_ref", "ppo/grad_norm", "ppo/tokens"):
        np.testing.assert_allclose(float(m4[k]), float(m1[k]), rtol=2e-5, err_msg=k)
    # grad_norm above pins the gradient's scale; the first Adam step is ~lr * sign(g), where float noise on
    # near-zero gradient entries shows, so the parameters are compared at 1% of one step
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=3e-4), s4.params, s1.params)


class LogitProbe(nnx.Module):
    """The policy plus a trainable additive bias on every logit: its gradient is the gradient w.r.t. the
    logits. (It has no `hidden_states`, so the train step takes the full-logits path.)"""

    def __init__(self, c: ModelConfig, shape, rngs):
        self.lm = Transformer(c, rngs)
        self.bias = nnx.Param(jnp.zeros(shape, jnp.float32))

    def __call__(self, tokens, positions, segment_ids=None):
        return self.lm(tokens, positions, segment_ids) + self.bias[...]


def test_no_gradient_flows_from_observation_or_padding_tokens():
    c = TINY
    n = 4
    model = LogitProbe(c, (n, T, c.vocab_size), nnx.Rngs(0))
    policy = ts.create_train_state(model, OPT1, CFG)  # weight_decay 0: a zero gradient means no move
    seq, rewards = multiturn_rollout(n, T, seed=5)
    mask = np.asarray(seq.loss_mask)
    assert mask.sum() > 0 and (mask == 0).sum() > 0
    prox, _ = ts.policy_logprobs(policy, micro(seq, 1))
    prox = prox.reshape(n, T)
    garbage = lambda x: jnp.where(seq.loss_mask > 0, x, jnp.nan)  # noqa: E731
    adv = jnp.asarray(np.random.default_rng(0).normal(size=(n, T)).astype(np.float32))
    batch = ts.PolicyBatch(seq, garbage(prox - 0.1), garbage(prox), garbage(adv), garbage(prox + 0.1))
    new, m = ts.policy_train_step(policy, micro(batch, 1))
    assert np.isfinite(float(m["ppo/policy_loss"])) and np.isfinite(float(m["ppo/grad_norm"]))
    moved = np.any(np.asarray(new.params["bias"][...]) != 0, axis=-1)  # [n, T]: logits row t - 1 predicts token t
    predicts_policy_token = np.concatenate([mask[:, 1:], np.zeros((n, 1))], axis=1) > 0
    np.testing.assert_array_equal(moved, predicts_policy_token)
    # and the rest of the network received a gradient
    assert not jnp.array_equal(new.params["lm"]["lm_head"][...], policy.params["lm"]["lm_head"][...])


def test_critic_step_fits_returns_and_value_clip_limits_the_move():
    critic = ts.create_train_state(make_critic(), OPT1, CFG)  # value_clip_eps 0.2
    seq, rewards = multiturn_rollout(4, T, seed=2)
    seq_m = micro(seq, 2)
    ret = micro(jnp.where(seq.loss_mask > 0, 1.5, 0.0), 2)
    start = ts.critic_values(critic, seq_m)
    losses = []
    for _ in range(30):  # PPO style: old values refreshed before each step, so the clip band follows
        old = ts.critic_values(critic, seq_m)
        critic, m = ts.critic_train_step(critic, ts.CriticBatch(seq_m, ret, old))
        losses.append(float(m["critic/value_loss"]))
    assert losses[-1] < 0.1 * losses[0]
    # against the values of the start (~0), the new values (~1.5) are outside the 0.2 band: clipped branch
    _, m = ts.critic_train_step(critic, ts.CriticBatch(seq_m, ret, start))
    assert float(m["critic/value_clip_frac"]) > 0.9


def test_sft_step_learns_a_fixed_batch():
    policy = ts.create_train_state(make_policy(), OPT1, CFG)
    seq, _ = multiturn_rollout(4, T, seed=3)
    batch = micro(seq, 2)
    nll = []
    for _ in range(40):
        policy, m = ts.sft_train_step(policy, batch)
        nll.append(float(m["sft/nll"]))
    assert nll[-1] < 0.5 * nll[0]
    assert float(m["sft/accuracy"]) > 0.5


def test_a_step_with_a_non_finite_gradient_is_not_applied():
    # One NaN gradient applied would make every parameter NaN from then on (the h200 warm start, where cuDNN left
    # padding rows of the attention gradient unwritten); the step is skipped and counted instead.
    policy = ts.create_train_state(make_policy(), OPT1, CFG)
    seq, _ = multiturn_rollout(4, T, seed=3)
    batch = micro(seq, 2)
    policy, m = ts.sft_train_step(policy, batch)  # a finite step first: non-trivial Adam moments
    assert float(m["sft/skipped_nonfinite"]) == 0.0 and int(policy.step) == 1
    # the same batch with one token id out of range (NaN through the embedding gather's fill value)
    bad = jax.tree.map(lambda x: x, batch)
    tokens = np.asarray(bad.tokens).copy()
    tokens[0, 0, 3] = 10 ** 6
    bad = dataclasses.replace(bad, tokens=jnp.asarray(tokens))
    before = jax.device_get((policy.params, policy.opt_state))
    after_state, m = ts.sft_train_step(policy, bad)
    if np.isfinite(float(m["sft/grad_norm"])):
        pytest.skip("this jax fills an out-of-range gather with a finite value: no NaN gradient to refuse")
    assert float(m["sft/skipped_nonfinite"]) == 1.0 and int(after_state.step) == 1
    for a, b in zip(jax.tree.leaves(jax.device_get((after_state.params, after_state.opt_state))), jax.tree.leaves(before)):
        np.testing.assert_array_equal(a, b)
    policy, m = ts.sft_train_step(after_state, batch)  # and training goes on from there
    assert float(m["sft/skipped_nonfinite"]) == 0.0 and int(policy.step) == 2
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(policy.params))


def test_non_finite_run_counts_skips_and_raises_at_its_limit_in_a_row():
    guard = ts.NonFiniteRun("stage warm_start", "step", limit=3)
    assert [guard.observe(x, i) for i, x in enumerate([True, True, False, True, True], 1)] == [True, True, False, True,
                                                                                              True]
    assert (guard.total, guard.in_a_row) == (4, 2)
    with pytest.raises(FloatingPointError, match=r"stage warm_start: 3 steps in a row had only non-finite gradients "
                                                 r"\(last: step 6\)"):
        guard.observe(True, 6)


def test_lr_schedule_warmup_and_decay():
    _, sched = ts.make_optimizer(OptimizerConfig(lr=1.0, warmup_steps=10, decay_steps=100, schedule="linear", end_lr_ratio=0.1))
    assert float(sched(0)) == 0.0
    assert float(sched(5)) == pytest.approx(0.5)
    assert float(sched(10)) == pytest.approx(1.0)
    assert float(sched(60)) == pytest.approx(0.55)
    assert float(sched(1000)) == pytest.approx(0.1)
    _, cos = ts.make_optimizer(OptimizerConfig(lr=1.0, warmup_steps=0, decay_steps=100, schedule="cosine", end_lr_ratio=0.0))
    assert float(cos(50)) == pytest.approx(0.5, abs=1e-6)


def test_rollout_rows_must_fill_minibatches():
    cfg = PPOConfig(minibatch_size=4, microbatch_size=2)
    policy = ts.create_train_state(make_policy(), OPT0, cfg)
    critic = ts.create_train_state(make_critic(), OPT0, cfg)
    ro = rollout_for(policy, 6)
    with pytest.raises(ValueError, match="multiple of ppo.minibatch_size"):
        ts.ppo_update(policy, critic, ro, jax.random.key(0))


def test_chunked_logprobs_equal_full_logits():
    cfg_full = dataclasses.replace(CFG, logits_chunk_size=0)
    policy = ts.create_train_state(make_policy(), OPT1, CFG)
    seq, _ = multiturn_rollout(4, T, seed=9)
    lp_chunk, ent_chunk = ts.policy_logprobs(policy, micro(seq, 2))
    lp_full, ent_full = ts.policy_logprobs(policy.replace(ppo=cfg_full), micro(seq, 2))
    np.testing.assert_allclose(lp_chunk, lp_full, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ent_chunk, ent_full, rtol=1e-5, atol=1e-6)
    # and the same gradients
    adv = jnp.where(seq.loss_mask > 0, 1.0, 0.0)
    batch = micro(ts.PolicyBatch(seq, lp_full.reshape(4, T), lp_full.reshape(4, T), adv), 2)
    s_full, m_full = ts.policy_train_step(policy.replace(ppo=cfg_full), batch)
    s_chunk, m_chunk = ts.policy_train_step(policy, batch)
    np.testing.assert_allclose(float(m_chunk["ppo/grad_norm"]), float(m_full["ppo/grad_norm"]), rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=3e-4), s_chunk.params, s_full.params)
