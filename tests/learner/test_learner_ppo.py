"""learner.ppo against plain NumPy references on random inputs, and multi-turn credit assignment on
trajectories of 200 turns."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from learner import ppo
from learner.config import PPOConfig

RNG = np.random.default_rng(1234)


# ---------------------------------------------------------------------------------------------------------
# NumPy references (loops, float64), written from the textbook definitions
# ---------------------------------------------------------------------------------------------------------


def np_gae_compact(rewards, values, mask, gamma, lam, segment_ids=None):
    """Definition: per trajectory, take the policy tokens only, run textbook GAE on that short sequence
    (terminal after the last one), scatter back."""
    B, T = rewards.shape
    adv = np.zeros((B, T))
    ret = np.zeros((B, T))
    seg = np.ones((B, T), np.int64) if segment_ids is None else segment_ids
    for b in range(B):
        # contiguous runs of equal segment id
        starts = [0] + [t for t in range(1, T) if seg[b, t] != seg[b, t - 1]]
        ends = starts[1:] + [T]
        for s, e in zip(starts, ends):
            idx = [t for t in range(s, e) if mask[b, t]]
            n = len(idx)
            last = 0.0
            for k in reversed(range(n)):
                t = idx[k]
                nv = values[b, idx[k + 1]] if k + 1 < n else 0.0
                delta = rewards[b, t] + gamma * nv - values[b, t]
                last = delta + gamma * lam * last
                adv[b, t] = last
                ret[b, t] = last + values[b, t]
    return adv, ret


def np_policy_terms(logp, prox, behav, adv, mask, cfg: PPOConfig):
    m = mask.astype(bool)
    logp, prox, behav, adv = (np.where(m, x, 0.0).astype(np.float64) for x in (logp, prox, behav, adv))
    if not cfg.decoupled:
        prox = behav
    ratio = np.exp(logp - prox)
    hi = cfg.clip_eps if cfg.clip_eps_high is None else cfg.clip_eps_high
    out_loss = np.zeros_like(ratio)
    clipped = np.zeros_like(ratio)
    dual = np.zeros_like(ratio)
    wts = np.zeros_like(ratio)
    capped = np.zeros_like(ratio)
    for i in np.ndindex(ratio.shape):
        if not m[i]:
            continue
        r, a = ratio[i], adv[i]
        unclipped_obj = r * a
        clipped_obj = min(max(r, 1 - cfg.clip_eps), 1 + hi) * a
        obj = min(unclipped_obj, clipped_obj)
        clipped[i] = clipped_obj < unclipped_obj
        if cfg.dual_clip_c is not None and a < 0:
            if obj < cfg.dual_clip_c * a:
                dual[i] = 1
                obj = cfg.dual_clip_c * a
        w = 1.0
        if cfg.decoupled:
            w = np.exp(prox[i] - behav[i])
            C = cfg.behaviour_weight_cap
            if C is not None and w > C:
                capped[i] = 1
                w = C if cfg.behaviour_weight_mode == "truncate" else 0.0
        wts[i] = w
        out_loss[i] = -w * obj
    return out_loss, np.where(m, ratio, 0), clipped, dual, wts, capped


def np_value_loss(v, old, ret, mask, eps):
    out = np.zeros_like(v, dtype=np.float64)
    for i in np.ndindex(v.shape):
        if not mask[i]:
            continue
        l1 = (v[i] - ret[i]) ** 2
        if eps is None:
            out[i] = 0.5 * l1
        else:
            vc = old[i] + min(max(v[i] - old[i], -eps), eps)
            out[i] = 0.5 * max(l1, (vc - ret[i]) ** 2)
    return out


def random_mask(B, T, p=0.5):
    m = (RNG.random((B, T)) < p).astype(np.float32)
    m[:, 0] = 0
    return m


# ---------------------------------------------------------------------------------------------------------
# masked statistics and token alignment
# ---------------------------------------------------------------------------------------------------------


def test_masked_statistics_match_numpy_and_ignore_garbage():
    x = RNG.normal(3.0, 2.0, (5, 37)).astype(np.float32)
    m = random_mask(5, 37)
    xg = np.where(m > 0, x, np.nan).astype(np.float32)  # garbage off the mask must not leak
    sel = x[m > 0].astype(np.float64)
    np.testing.assert_allclose(ppo.masked_sum(xg, m), sel.sum(), rtol=1e-5)
    np.testing.assert_allclose(ppo.masked_mean(xg, m), sel.mean(), rtol=1e-5)
    np.testing.assert_allclose(ppo.masked_var(xg, m), sel.var(), rtol=1e-4)
    w = np.asarray(ppo.masked_whiten(xg, m))
    np.testing.assert_allclose(w[m > 0], (sel - sel.mean()) / np.sqrt(sel.var() + 1e-8), rtol=1e-4, atol=1e-5)
    assert np.all(w[m == 0] == 0)
    # per-row means
    rows = [x[b][m[b] > 0].mean() if m[b].sum() else 0.0 for b in range(5)]
    np.testing.assert_allclose(ppo.masked_mean(xg, m, axis=1), rows, rtol=1e-5)
    # explained variance
    ret = RNG.normal(size=(5, 37)).astype(np.float32)
    val = (ret + 0.3 * RNG.normal(size=(5, 37))).astype(np.float32)
    r, v = ret[m > 0].astype(np.float64), val[m > 0].astype(np.float64)
    np.testing.assert_allclose(ppo.explained_variance(val, ret, m), 1 - np.var(r - v) / np.var(r), rtol=1e-4)
    assert float(ppo.explained_variance(val, np.ones_like(ret), m)) == 0.0
    assert float(ppo.masked_mean(xg, np.zeros_like(m))) == 0.0


def test_token_logprobs_and_entropy_match_numpy():
    B, T, V = 3, 11, 17
    logits = RNG.normal(0, 3, (B, T, V)).astype(np.float32)
    tokens = RNG.integers(0, V, (B, T)).astype(np.int32)
    for temp in (1.0, 0.7):
        lp, ent = ppo.token_logprobs_and_entropy(jnp.asarray(logits), jnp.asarray(tokens), temp)
        z = logits.astype(np.float64) / temp
        logsm = z - np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1, keepdims=True)) - z.max(-1, keepdims=True)
        ref_lp = np.zeros((B, T))
        ref_ent = np.zeros((B, T))
        for b in range(B):
            for t in range(1, T):
                ref_lp[b, t] = logsm[b, t - 1, tokens[b, t]]
                ref_ent[b, t] = -(np.exp(logsm[b, t - 1]) * logsm[b, t - 1]).sum()
        np.testing.assert_allclose(lp, ref_lp, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(ent, ref_ent, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------------------
# GAE
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.99, 0.95), (0.9, 0.0), (0.8, 0.6)])
def test_gae_matches_numpy_on_random_masks(gamma, lam):
    B, T = 6, 53
    rewards = RNG.normal(size=(B, T)).astype(np.float32)
    values = RNG.normal(size=(B, T)).astype(np.float32)
    mask = random_mask(B, T, 0.6)
    adv, ret = ppo.gae(rewards, values, mask, gamma, lam)
    ref_adv, ref_ret = np_gae_compact(rewards, values, mask, gamma, lam)
    np.testing.assert_allclose(adv, ref_adv, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(ret, ref_ret, rtol=1e-4, atol=1e-4)


def test_gae_resets_at_packed_segment_boundaries():
    B, T = 4, 64
    rewards = RNG.normal(size=(B, T)).astype(np.float32)
    values = RNG.normal(size=(B, T)).astype(np.float32)
    mask = random_mask(B, T, 0.7)
    seg = np.zeros((B, T), np.int32)
    for b in range(B):
        cuts = np.sort(RNG.choice(np.arange(1, T - 4), size=3, replace=False))
        ids = np.searchsorted(cuts, np.arange(T), side="right") + 1
        ids[T - 3 :] = 0  # trailing padding
        seg[b] = ids
        for s in [0, *cuts]:
            mask[b, s] = 0  # first token of each trajectory is a prompt token
    mask[seg == 0] = 0
    adv, ret = ppo.gae(rewards, values, mask, 0.97, 0.9, segment_ids=seg)
    ref_adv, ref_ret = np_gae_compact(rewards, values, mask, 0.97, 0.9, segment_ids=seg)
    np.testing.assert_allclose(adv, ref_adv, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(ret, ref_ret, rtol=1e-4, atol=1e-4)
    # without the segment ids the recursion would leak credit across trajectories: the test can fail
    leak, _ = ppo.gae(rewards, values, mask, 0.97, 0.9)
    assert not np.allclose(leak, ref_adv, atol=1e-3)


def make_multiturn(turns, rng, max_obs=9, max_act=7, prompt=5):
    """One trajectory of `turns` assistant turns separated by observation spans. Returns mask and turn starts."""
    mask = [0] * prompt
    turn_starts = []
    for k in range(turns):
        n_act = int(rng.integers(1, max_act + 1))
        turn_starts.append(len(mask))
        mask += [1] * n_act
        if k < turns - 1:
            mask += [0] * int(rng.integers(1, max_obs + 1))
    return np.asarray(mask, np.float32), turn_starts


def test_gae_200_turns_credit_reaches_first_turn_and_skips_observations():
    rng = np.random.default_rng(7)
    mask, turn_starts = make_multiturn(200, rng)
    T = mask.size
    policy_idx = np.nonzero(mask)[0]
    last = policy_idx[-1]
    final_reward = 3.0
    rewards = np.zeros((1, T), np.float32)
    rewards[0, last] = final_reward
    # garbage rewards / values on observation tokens must be ignored
    rewards_g = np.where(mask[None] > 0, rewards, np.float32(np.nan))
    zeros_g = np.where(mask[None] > 0, 0.0, np.float32(1e6)).astype(np.float32)

    # gamma = lam = 1, V = 0: every policy token of every turn gets the final reward, observations get 0
    adv, ret = ppo.gae(rewards_g, zeros_g, mask[None], 1.0, 1.0)
    adv, ret = np.asarray(adv)[0], np.asarray(ret)[0]
    assert np.all(np.isfinite(adv))
    np.testing.assert_allclose(adv[mask > 0], final_reward, rtol=1e-6)
    np.testing.assert_allclose(ret[mask > 0], final_reward, rtol=1e-6)
    assert np.all(adv[mask == 0] == 0) and np.all(ret[mask == 0] == 0)

    # gamma < 1: discounting counts policy tokens only, never observation tokens
    gamma = 0.999
    adv, _ = ppo.gae(rewards_g, zeros_g, mask[None], gamma, 1.0)
    adv = np.asarray(adv)[0]
    n_after = np.cumsum(mask[::-1])[::-1] - 1  # policy tokens after t (t included -> minus one)
    np.testing.assert_allclose(adv[mask > 0], final_reward * gamma ** n_after[mask > 0], rtol=1e-4)
    assert adv[turn_starts[0]] == pytest.approx(final_reward * gamma ** (mask.sum() - 1), rel=1e-4)

    # lam = 1 with a critic: A_t = sum of future policy-token rewards - V_t (Monte Carlo), turn by turn
    values = rng.normal(size=(1, T)).astype(np.float32)
    adv, ret = ppo.gae(rewards, values, mask[None], 1.0, 1.0)
    np.testing.assert_allclose(np.asarray(adv)[0][mask > 0], final_reward - values[0][mask > 0], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.asarray(ret)[0][mask > 0], final_reward, rtol=1e-4, atol=1e-4)

    # general gamma / lambda against the compact NumPy reference on the full 200-turn trajectory
    r2 = rng.normal(size=(1, T)).astype(np.float32) * mask[None]
    adv, ret = ppo.gae(r2, values, mask[None], 0.99, 0.95)
    ref_adv, ref_ret = np_gae_compact(r2, values, mask[None], 0.99, 0.95)
    np.testing.assert_allclose(adv, ref_adv, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(ret, ref_ret, rtol=1e-4, atol=1e-4)

    # the TD error at the last token of a turn bootstraps from the first token of the next turn
    lam0, _ = ppo.gae(rewards, values, mask[None], 1.0, 0.0)
    lam0 = np.asarray(lam0)[0]
    for k in range(len(turn_starts) - 1):
        end_of_turn = turn_starts[k + 1] - 1
        while mask[end_of_turn] == 0:
            end_of_turn -= 1
        expected = values[0, turn_starts[k + 1]] - values[0, end_of_turn]
        assert lam0[end_of_turn] == pytest.approx(expected, rel=1e-5, abs=1e-5)


def test_gae_jits_and_runs_on_long_rows():
    T = 32_768
    mask = (np.arange(T) % 3 != 0).astype(np.float32)[None]
    rewards = np.zeros((1, T), np.float32)
    rewards[0, T - 1] = 1.0
    adv, _ = jax.jit(ppo.gae, static_argnums=(3, 4))(rewards, np.zeros_like(rewards), mask, 1.0, 1.0)
    np.testing.assert_allclose(np.asarray(adv)[mask > 0], 1.0, rtol=1e-6)


# ---------------------------------------------------------------------------------------------------------
# losses
# ---------------------------------------------------------------------------------------------------------

POLICY_CONFIGS = [
    PPOConfig(),
    PPOConfig(behaviour_weight_mode="mask", behaviour_weight_cap=1.5),
    PPOConfig(dual_clip_c=3.0, clip_eps_high=0.28),
    PPOConfig(decoupled=False, dual_clip_c=2.0),
    PPOConfig(behaviour_weight_cap=None, clip_eps=0.1),
]


@pytest.mark.parametrize("cfg", POLICY_CONFIGS, ids=lambda c: f"dec{c.decoupled}-{c.behaviour_weight_mode}-{c.dual_clip_c}")
def test_policy_loss_terms_match_numpy(cfg):
    B, T = 4, 41
    mask = random_mask(B, T, 0.7)
    prox = RNG.normal(-2, 1, (B, T)).astype(np.float32)
    logp = (prox + RNG.normal(0, 1.0, (B, T))).astype(np.float32)
    behav = (prox + RNG.normal(0, 0.8, (B, T))).astype(np.float32)
    adv = RNG.normal(0, 2, (B, T)).astype(np.float32)
    garbage = lambda x: np.where(mask > 0, x, np.float32(np.inf))  # noqa: E731
    terms = ppo.policy_loss_terms(logp, garbage(prox), garbage(behav), garbage(adv), mask, cfg)
    loss, ratio, clipped, dual, w, capped = np_policy_terms(logp, prox, behav, adv, mask, cfg)
    np.testing.assert_allclose(terms.loss, loss, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(terms.ratio, ratio, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(terms.clipped, clipped)
    np.testing.assert_array_equal(terms.dual_clipped, dual)
    np.testing.assert_allclose(terms.behaviour_weight, np.where(mask > 0, w, 0), rtol=1e-5)
    np.testing.assert_array_equal(terms.behaviour_capped, capped)
    assert terms.clipped.sum() > 0  # the random draw exercises the clip
    if cfg.dual_clip_c is not None:
        assert terms.dual_clipped.sum() > 0


def test_policy_loss_ratio_one_when_current_equals_proximal():
    B, T = 2, 30
    mask = random_mask(B, T)
    prox = RNG.normal(-1, 1, (B, T)).astype(np.float32)
    behav = (prox - 0.1).astype(np.float32)
    adv = RNG.normal(size=(B, T)).astype(np.float32)
    terms = ppo.policy_loss_terms(prox, prox, behav, adv, mask, PPOConfig())
    assert np.all(np.asarray(terms.ratio)[mask > 0] == 1.0)
    assert float(terms.clipped.sum()) == 0.0 and float(terms.approx_kl.sum()) == 0.0
    np.testing.assert_allclose(terms.loss, -np.exp(0.1) * adv * mask, rtol=1e-5)


def test_policy_loss_gradient_is_zero_off_the_loss_mask():
    B, T = 3, 25
    mask = random_mask(B, T)
    logp = RNG.normal(-2, 1, (B, T)).astype(np.float32)
    nan_off = lambda x: np.where(mask > 0, x, np.float32(np.nan))  # noqa: E731
    prox, behav, adv = nan_off(logp + 0.1), nan_off(logp - 0.2), nan_off(RNG.normal(size=(B, T)))
    cfg = PPOConfig(dual_clip_c=3.0)

    def f(lp):
        t = ppo.policy_loss_terms(lp, prox, behav, adv, mask, cfg)
        return jnp.sum(t.loss) + jnp.sum(ppo.kl_penalty(lp, prox, mask))

    g = np.asarray(jax.grad(f)(jnp.asarray(logp)))
    assert np.all(np.isfinite(g))
    assert np.all(g[mask == 0] == 0)
    assert np.any(g[mask > 0] != 0)


@pytest.mark.parametrize("est", ["k1", "k2", "k3"])
def test_kl_penalty_matches_numpy(est):
    mask = random_mask(3, 20)
    lp = RNG.normal(-2, 1, (3, 20)).astype(np.float32)
    ref = (lp + RNG.normal(0, 0.5, (3, 20))).astype(np.float32)
    d = (ref - lp).astype(np.float64)
    want = {"k1": -d, "k2": 0.5 * d**2, "k3": np.exp(d) - 1 - d}[est] * mask
    np.testing.assert_allclose(ppo.kl_penalty(lp, ref, mask, est), want, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="unknown KL estimator"):
        ppo.kl_penalty(lp, ref, mask, "k9")


@pytest.mark.parametrize("eps", [None, 0.2])
def test_value_loss_matches_numpy(eps):
    mask = random_mask(4, 33)
    ret = RNG.normal(size=(4, 33)).astype(np.float32)
    old = RNG.normal(size=(4, 33)).astype(np.float32)
    v = (old + RNG.normal(0, 0.5, (4, 33))).astype(np.float32)
    terms = ppo.value_loss_terms(v, old, ret, mask, eps)
    np.testing.assert_allclose(terms.loss, np_value_loss(v, old, ret, mask, eps), rtol=1e-5, atol=1e-6)
    if eps is not None:
        assert float(terms.clipped.sum()) > 0


def test_config_validation_names_the_field():
    with pytest.raises(ValueError, match="dual_clip_c"):
        PPOConfig(dual_clip_c=0.5)
    with pytest.raises(ValueError, match="behaviour_weight_mode"):
        PPOConfig(behaviour_weight_mode="clip")
    with pytest.raises(ValueError, match="multiple of microbatch_size"):
        PPOConfig(minibatch_size=6, microbatch_size=4)
    assert dataclasses.replace(PPOConfig(), minibatch_size=16, microbatch_size=4).grad_accum_steps == 4


def test_checkpoint_is_due_by_count_or_by_time():
    from learner.config import CheckpointConfig

    by_count = CheckpointConfig(every_updates=2)
    assert [by_count.due(u, 0.0) for u in (1, 2, 3, 4)] == [False, True, False, True]
    by_time = CheckpointConfig(every_updates=0, every_s=300.0)
    assert not by_time.due(7, 299.0) and by_time.due(7, 300.0)
    both = CheckpointConfig(every_updates=5, every_s=60.0)
    assert both.due(5, 1.0) and both.due(3, 61.0) and not both.due(3, 59.0)
    assert not CheckpointConfig(every_updates=0, every_s=0.0).due(100, 1e9)  # only at the end and on SIGTERM
    with pytest.raises(ValueError, match="every_updates and every_s"):
        CheckpointConfig(every_s=-1.0)
