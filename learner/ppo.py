"""PPO math as pure JAX functions: token alignment, GAE over multi-turn trajectories, losses, masked statistics.

Nothing here touches a model, an optimiser or I/O; every function is jit-able and tested against plain NumPy
(tests/learner/test_ppo.py).

Token alignment (every per-token array is `[B, T]`, aligned with `tokens`)
-------------------------------------------------------------------------
Position t describes the step that *produced* token t: `logprobs[:, t] = log pi(tokens[t] | tokens[:t])`,
computed from the logits at position t - 1, and `values[:, t] = V(tokens[:t])`, the critic's output at position
t - 1 (the value of the state just before token t). Position 0 has no predecessor and is 0; the first token
of every trajectory is a prompt token, so `loss_mask[:, 0]` (and the first position of every packed segment)
is 0. `loss_mask[:, t] = 1` marks tokens the policy generated (assistant tokens); prompt, tool-observation and
padding tokens are 0. The actors' behaviour logprobs use the same alignment.

Multi-turn credit assignment (observation tokens)
-------------------------------------------------
An agentic trajectory interleaves policy spans (assistant turns) with observation spans (tool output, the
environment's reply). The MDP is taken over *policy tokens only*: the action is a generated token, the state is
the whole prefix, and an observation span is part of the environment's transition from the last token of one
turn to the first token of the next. So GAE (Schulman et al. 2016, arXiv 1506.02438) runs over the sequence of
policy tokens of each trajectory, as if the observation tokens were not there:

    delta_t = r_t + gamma * V(next policy token in the trajectory, 0 at the end) - V_t
    A_t     = delta_t + gamma * lam * A(next policy token)

Observation tokens neither discount (gamma is applied per policy token) nor cut the recursion; their own
values, rewards and TD errors are ignored and their advantages / returns are 0 (they carry no loss anyway).
This is the rule of verl's `compute_gae_advantage_return` (verl/trainer/ppo/core_algos.py, "skip values and
TD-error on observation tokens"), written here as a linear recurrence solved with an associative scan, with
resets at packed-segment boundaries. Rewards are read on policy tokens only: the milestone reward of an
episode sits on its last policy token (`learner.batch`). The last policy token of a trajectory is terminal
(next value 0), also for an episode cut by the turn or context limit: its milestone reward is final either way.

Decoupled PPO (asynchronous rollouts; AReaL, Fu et al. 2025, arXiv 2505.24298, Section 5)
------------------------------------------------------------------------------------------
Trajectories come from behaviour policies pi_behav that may lag the learner by a few versions. At the start
of an update the learner recomputes the proximal logprobs pi_prox with its current parameters, and each
policy token t contributes

    L_t(theta) = - w_t * min( u_t * A_t, clip(u_t, 1 - eps, 1 + eps_high) * A_t ),
    u_t = pi_theta(a_t | s_t) / pi_prox(a_t | s_t),
    w_t = min( pi_prox(a_t | s_t) / pi_behav(a_t | s_t), C )              (behaviour_weight_mode="truncate")
    w_t = pi_prox / pi_behav if pi_prox / pi_behav <= C else 0            (behaviour_weight_mode="mask", AReaL's code)

with w_t a constant (no gradient). With dual clip (Ye et al. 2020, arXiv 1912.09729) the loss of a token with
A_t < 0 is further bounded: min(L_t / w_t, -c * A_t) * w_t. Because pi_prox is the learner's own current policy,
u_t = 1 exactly on the first minibatch of an update at any learning rate (tested at learning rate 0). Classic
PPO (decoupled=False) is u_t = pi_theta / pi_behav and w_t = 1.

The policy objective per update minibatch is the token mean over policy tokens:
    J = sum_t m_t L_t / N  -  entropy_coef * sum_t m_t H_t / N  +  kl_coef * sum_t m_t KL_t / N,   N = sum_t m_t,
N counted over the whole minibatch, so gradient accumulation over microbatches equals one big batch.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from learner.config import PPOConfig

Array = jax.Array


# ----------------------------------------------------------------------------------------------------------
# masked statistics
# ----------------------------------------------------------------------------------------------------------


def masked_sum(x: Array, mask: Array, axis=None) -> Array:
    """Sum of `x` where `mask` is true; masked-out entries may hold anything (NaN included)."""
    return jnp.sum(jnp.where(mask.astype(bool), x, 0.0), axis=axis)


def masked_mean(x: Array, mask: Array, axis=None) -> Array:
    """Mean of `x` over `mask`; 0 where the mask is empty."""
    n = jnp.sum(mask.astype(jnp.float32), axis=axis)
    return masked_sum(x, mask, axis) / jnp.maximum(n, 1.0)


def masked_var(x: Array, mask: Array, axis=None) -> Array:
    """Population variance of `x` over `mask` (two-pass, so large means do not cancel); 0 on an empty mask."""
    mean = masked_mean(x, mask, axis)
    if axis is not None:
        mean = jnp.expand_dims(mean, axis)
    return masked_mean(jnp.square(x - mean), mask, axis)


def masked_whiten(x: Array, mask: Array, eps: float = 1e-8) -> Array:
    """(x - mean) / sqrt(var + eps) over the masked entries of the whole array; 0 outside the mask.

    Used for advantage normalisation over all policy tokens of an update batch.
    """
    mean = masked_mean(x, mask)
    var = masked_var(x, mask)
    return jnp.where(mask.astype(bool), (x - mean) * jax.lax.rsqrt(var + eps), 0.0)


def explained_variance(values: Array, returns: Array, mask: Array) -> Array:
    """1 - Var[returns - values] / Var[returns] over `mask`; 0 when the returns have no variance."""
    var_y = masked_var(returns, mask)
    var_res = masked_var(returns - values, mask)
    return jnp.where(var_y > 0, 1.0 - var_res / jnp.where(var_y > 0, var_y, 1.0), 0.0)


# ----------------------------------------------------------------------------------------------------------
# token alignment
# ----------------------------------------------------------------------------------------------------------


def shift_right(x: Array, fill=0) -> Array:
    """`out[:, t] = x[:, t - 1]`, `out[:, 0] = fill` (turns per-position model outputs into per-token values)."""
    pad = jnp.full_like(x[:, :1], fill)
    return jnp.concatenate([pad, x[:, :-1]], axis=1)


def next_token_logprobs_and_entropy(logits: Array, next_tokens: Array, temperature: float = 1.0) -> tuple[Array, Array]:
    """Per position t: log pi(next_tokens[t] | logits[t]) and the entropy of that distribution.

    logits `[..., V]` (any float dtype; float32 math), next_tokens `[...]` int32 -> two `[...]` f32 arrays.
    Same formula as `learner.model.token_logprobs` (picked logit - logsumexp of the tempered logits), so the
    learner's numbers match the sampler's behaviour logprobs for the same weights.
    """
    z = logits.astype(jnp.float32) / temperature
    lse = jax.nn.logsumexp(z, axis=-1)
    picked = jnp.take_along_axis(z, next_tokens[..., None].astype(jnp.int32), axis=-1)[..., 0]
    ent = lse - jnp.sum(jax.nn.softmax(z, axis=-1) * z, axis=-1)
    return picked - lse, ent


def next_tokens(tokens: Array) -> Array:
    """`out[:, t] = tokens[:, t + 1]` (the last position wraps around; its outputs are discarded by `shift_right`)."""
    return jnp.concatenate([tokens[:, 1:], tokens[:, :1]], axis=1)


def token_logprobs_and_entropy(logits: Array, tokens: Array, temperature: float = 1.0) -> tuple[Array, Array]:
    """Logprob of each token under the policy and the entropy of the distribution it was drawn from.

    Args:
      logits: `[B, T, V]` model outputs (any float dtype; computed in float32).
      tokens: `[B, T]` int32 token ids.
      temperature: the sampling temperature (logits are divided by it).
    Returns:
      logprobs `[B, T]` f32 with `logprobs[:, t] = log softmax(logits[:, t-1] / temperature)[tokens[:, t]]`,
      entropy `[B, T]` f32 of that same distribution; both 0 at t = 0.
    """
    lp, ent = next_token_logprobs_and_entropy(logits, next_tokens(tokens), temperature)
    return shift_right(lp), shift_right(ent)


# ----------------------------------------------------------------------------------------------------------
# GAE over policy tokens
# ----------------------------------------------------------------------------------------------------------


def _reverse_linear_recurrence(a: Array, b: Array) -> Array:
    """Solve x_t = a_t * x_{t+1} + b_t along axis 1 with x_T = 0 (associative scan, O(log T) depth)."""

    def combine(later, earlier):
        # associative_scan(reverse=True) folds from the end: `later` covers positions after `earlier`.
        a_l, b_l = later
        a_e, b_e = earlier
        return a_e * a_l, a_e * b_l + b_e

    _, x = jax.lax.associative_scan(combine, (a, b), reverse=True, axis=1)
    return x


@functools.partial(jax.jit, static_argnames=("gamma", "lam"))
def gae(
    rewards: Array,
    values: Array,
    loss_mask: Array,
    gamma: float,
    lam: float,
    segment_ids: Array | None = None,
) -> tuple[Array, Array]:
    """Generalised advantage estimation over the policy tokens of (packed) multi-turn trajectories.

    See the module docstring for the rule on observation tokens and its source.

    Args:
      rewards: `[B, T]` f32 per-token rewards, read at policy tokens only (the final reward of an episode on
        its last policy token).
      values: `[B, T]` f32 critic values V(tokens[:t]) (token-aligned, see the module docstring); read at policy
        tokens only.
      loss_mask: `[B, T]` 1 on policy tokens.
      gamma, lam: discount per policy token and GAE lambda.
      segment_ids: `[B, T]` int32 ids of packed trajectories (0 = padding); the recursion never crosses a change
        of id. None = one trajectory per row.
    Returns:
      advantages `[B, T]` f32 and returns `[B, T]` f32 (= advantages + values), 0 off policy tokens.
    """
    m = loss_mask.astype(bool)
    mf = m.astype(jnp.float32)
    r = jnp.where(m, rewards.astype(jnp.float32), 0.0)
    v = jnp.where(m, values.astype(jnp.float32), 0.0)
    # 1 where position t + 1 continues the trajectory of position t.
    if segment_ids is None:
        cont = jnp.ones_like(mf)
    else:
        cont = (segment_ids[:, :-1] == segment_ids[:, 1:]).astype(jnp.float32)
        cont = jnp.concatenate([cont, jnp.zeros_like(cont[:, :1])], axis=1)
    cont = cont.at[:, -1].set(0.0)

    def next_of(x):  # x[:, t + 1] within the same trajectory, else 0
        return jnp.concatenate([x[:, 1:], jnp.zeros_like(x[:, :1])], axis=1) * cont

    # y_t = value of the first policy token at position >= t (0 if none): y_t = m_t v_t + (1 - m_t) y_{t+1}.
    y = _reverse_linear_recurrence((1.0 - mf) * cont, mf * v)
    next_value = next_of(y)
    delta = jnp.where(m, r + gamma * next_value - v, 0.0)
    # z_t = advantage of the first policy token at position >= t:
    #   z_t = m_t (delta_t + gamma lam z_{t+1}) + (1 - m_t) z_{t+1}.
    coef = jnp.where(m, gamma * lam, 1.0) * cont
    z = _reverse_linear_recurrence(coef, delta)
    adv = jnp.where(m, z, 0.0)
    ret = jnp.where(m, adv + v, 0.0)
    return adv, ret


# ----------------------------------------------------------------------------------------------------------
# losses (per-token terms; the train step reduces them)
# ----------------------------------------------------------------------------------------------------------


class PolicyTerms(NamedTuple):
    """Per-token pieces of the PPO policy loss, all `[B, T]` f32 and 0 off the loss mask."""

    loss: Array  # w_t * clipped surrogate loss (see module docstring)
    ratio: Array  # u_t = pi_theta / pi_prox
    clipped: Array  # 1 where the clipped branch of the surrogate is active
    dual_clipped: Array  # 1 where the dual clip bounds the loss
    behaviour_weight: Array  # w_t
    behaviour_capped: Array  # 1 where the cap C acted (truncated or masked)
    approx_kl: Array  # k3 estimate of KL(pi_prox || pi_theta): (u - 1) - log u


def policy_loss_terms(
    logprobs: Array,
    proximal_logprobs: Array,
    behaviour_logprobs: Array,
    advantages: Array,
    loss_mask: Array,
    cfg: PPOConfig,
) -> PolicyTerms:
    """Decoupled clipped surrogate per policy token (formula in the module docstring).

    Args:
      logprobs: `[B, T]` f32 log pi_theta of the taken tokens (differentiable).
      proximal_logprobs: `[B, T]` f32 log pi_prox, recomputed by the learner at update start (ignored when
        `cfg.decoupled` is False).
      behaviour_logprobs: `[B, T]` f32 log pi_behav reported by the actors.
      advantages: `[B, T]` f32.
      loss_mask: `[B, T]` 1 on policy tokens; other entries of the inputs may hold anything (NaN, inf).
      cfg: clip ranges, dual clip, behaviour-weight cap and mode.
    """
    m = loss_mask.astype(bool)
    safe = lambda x: jnp.where(m, x.astype(jnp.float32), 0.0)  # noqa: E731
    logp = safe(logprobs)
    behav = jax.lax.stop_gradient(safe(behaviour_logprobs))
    adv = jax.lax.stop_gradient(safe(advantages))
    prox = jax.lax.stop_gradient(safe(proximal_logprobs)) if cfg.decoupled else behav

    log_ratio = logp - prox
    ratio = jnp.exp(log_ratio)
    eps_hi = cfg.clip_eps if cfg.clip_eps_high is None else cfg.clip_eps_high
    pg1 = -adv * ratio
    pg2 = -adv * jnp.clip(ratio, 1.0 - cfg.clip_eps, 1.0 + eps_hi)
    pg = jnp.maximum(pg1, pg2)
    clipped = pg2 > pg1
    if cfg.dual_clip_c is not None:
        pg3 = -cfg.dual_clip_c * adv  # > 0 where adv < 0
        dual = (adv < 0) & (pg > pg3)
        pg = jnp.where(adv < 0, jnp.minimum(pg, pg3), pg)
    else:
        dual = jnp.zeros_like(m)

    if cfg.decoupled:
        w = jnp.exp(prox - behav)
        cap = cfg.behaviour_weight_cap
        if cap is None:
            capped = jnp.zeros_like(m)
        elif cfg.behaviour_weight_mode == "truncate":
            capped = w > cap
            w = jnp.minimum(w, cap)
        else:  # "mask"
            capped = w > cap
            w = jnp.where(capped, 0.0, w)
    else:
        w = jnp.ones_like(ratio)
        capped = jnp.zeros_like(m)
    w = jax.lax.stop_gradient(w)

    f = lambda x: jnp.where(m, x, 0.0).astype(jnp.float32)  # noqa: E731
    return PolicyTerms(
        loss=f(w * pg),
        ratio=f(ratio),
        clipped=f(clipped),
        dual_clipped=f(dual),
        behaviour_weight=f(w),
        behaviour_capped=f(capped),
        approx_kl=f(jax.lax.stop_gradient((ratio - 1.0) - log_ratio)),
    )


def kl_penalty(logprobs: Array, ref_logprobs: Array, loss_mask: Array, estimator: str = "k3") -> Array:
    """Per-token estimate of KL(pi_theta || pi_ref) on samples of the policy (Schulman, "Approximating KL
    divergence", 2020): with d = log pi_ref - log pi_theta, k1 = -d, k2 = d^2 / 2, k3 = exp(d) - 1 - d.

    Args: `[B, T]` f32 logprobs (differentiable), reference logprobs (constant) and loss mask.
    Returns: `[B, T]` f32, 0 off the mask. Raises ValueError on an unknown estimator.
    """
    m = loss_mask.astype(bool)
    d = jnp.where(m, jax.lax.stop_gradient(ref_logprobs.astype(jnp.float32)), 0.0) - jnp.where(m, logprobs, 0.0)
    if estimator == "k1":
        k = -d
    elif estimator == "k2":
        k = 0.5 * jnp.square(d)
    elif estimator == "k3":
        k = jnp.exp(d) - 1.0 - d
    else:
        raise ValueError(f"unknown KL estimator {estimator!r}; expected k1, k2 or k3")
    return jnp.where(m, k, 0.0)


class ValueTerms(NamedTuple):
    """Per-token pieces of the critic loss, `[B, T]` f32, 0 off the mask."""

    loss: Array  # 0.5 * max((v - R)^2, (v_clipped - R)^2)
    clipped: Array  # 1 where the clipped branch is the larger one


def value_loss_terms(
    values: Array, old_values: Array, returns: Array, loss_mask: Array, clip_eps: float | None
) -> ValueTerms:
    """Clipped value loss (PPO2 baselines / Andrychowicz et al. 2021, arXiv 2006.05990, Section 3.3).

    v_clipped = v_old + clip(v - v_old, -eps, eps);  loss = 0.5 * max((v - R)^2, (v_clipped - R)^2);
    with `clip_eps=None`, loss = 0.5 * (v - R)^2.

    Args: `[B, T]` f32 new values (differentiable), values at update start, return targets, loss mask.
    """
    m = loss_mask.astype(bool)
    v = jnp.where(m, values.astype(jnp.float32), 0.0)
    ret = jax.lax.stop_gradient(jnp.where(m, returns.astype(jnp.float32), 0.0))
    l1 = jnp.square(v - ret)
    if clip_eps is None:
        loss, clipped = 0.5 * l1, jnp.zeros_like(m)
    else:
        old = jax.lax.stop_gradient(jnp.where(m, old_values.astype(jnp.float32), 0.0))
        vc = old + jnp.clip(v - old, -clip_eps, clip_eps)
        l2 = jnp.square(vc - ret)
        loss, clipped = 0.5 * jnp.maximum(l1, l2), l2 > l1
    f = lambda x: jnp.where(m, x, 0.0).astype(jnp.float32)  # noqa: E731
    return ValueTerms(loss=f(loss), clipped=f(clipped))
