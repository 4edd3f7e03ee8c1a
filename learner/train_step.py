"""Jitted train steps for the actor (policy) and the critic, the optimisers, and the PPO update driver.

Idiom: an NNX model is split once into `(graphdef, params, rest)`; a `TrainState` carries the parameter and
optimiser pytrees plus static fields (graphdef, Optax transformation, learning-rate schedule, PPO config).
Every step is a top-level pure function `(state, batch) -> (state, metrics)` compiled with `jax.jit`; the
model is rebuilt inside the trace with `nnx.merge`. Sharding comes from the inputs (see `learner.sharding`).

Batches of a step carry a leading microbatch axis: arrays are `[M, b, T]`; the step scans over the M
microbatches, accumulates gradients and applies one optimiser update (gradient accumulation). Losses are
token means over the whole `[M, b, T]` minibatch, so M microbatches of b rows give the same gradient as one
pass over M * b rows.

`ppo_update` is the (non-jitted) driver of one PPO update on a rollout batch: critic values, proximal
logprobs (and reference logprobs) recomputed at update start, GAE, advantage whitening, then epochs of
shuffled minibatches through `policy_train_step` and `critic_train_step`.
"""

from __future__ import annotations

import functools
import logging
import time
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx, struct

from jax.sharding import Mesh

from learner import ppo, sharding
from learner.config import OptimizerConfig, PPOConfig

Array = jax.Array
log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------------------------------------
# state and batches
# ----------------------------------------------------------------------------------------------------------


@struct.dataclass
class TrainState:
    """Parameters and optimiser state of one network (actor or critic).

    Fields: `step` int32 [] optimiser updates applied; `params` nnx.State of the `nnx.Param` variables;
    `rest` the other model variables (non-trainable); `opt_state` Optax state; static: `graphdef`, `tx`,
    `lr_schedule` (step -> learning rate), `ppo` (loss settings).
    """

    step: Array
    params: Any
    rest: Any
    opt_state: Any
    graphdef: Any = struct.field(pytree_node=False)
    tx: optax.GradientTransformation = struct.field(pytree_node=False)
    lr_schedule: Callable = struct.field(pytree_node=False)
    ppo: PPOConfig = struct.field(pytree_node=False)

    def model(self) -> nnx.Module:
        """The NNX module with this state's parameters."""
        return nnx.merge(self.graphdef, self.params, self.rest)


@struct.dataclass
class SequenceBatch:
    """Token rows. All `[..., T]`: tokens int32, positions int32 (restart at 0 per packed trajectory),
    segment_ids int32 (1.. per packed trajectory, 0 = padding), loss_mask f32 (1 on policy tokens)."""

    tokens: Array
    positions: Array
    segment_ids: Array
    loss_mask: Array


@struct.dataclass
class PolicyBatch:
    """Inputs of a policy step; per-token arrays `[M, b, T]` f32, token-aligned (see `learner.ppo`)."""

    seq: SequenceBatch
    behaviour_logprobs: Array
    proximal_logprobs: Array
    advantages: Array
    ref_logprobs: Optional[Array] = None


@struct.dataclass
class CriticBatch:
    """Inputs of a critic step: `returns` (targets) and `old_values` (values at update start), `[M, b, T]` f32."""

    seq: SequenceBatch
    returns: Array
    old_values: Array


@functools.lru_cache(maxsize=64)
def make_optimizer(cfg: OptimizerConfig) -> tuple[optax.GradientTransformation, Callable]:
    """AdamW with linear warm-up then cosine / linear / constant decay, after global-norm clipping.

    Cached per config: equal configs give the same (static) transformation, so restored or rebuilt train
    states reuse the compiled steps instead of compiling them again.

    Weight decay applies to matrices only (parameters with ndim >= 2), not to norms' scales and biases.
    Returns the transformation and its learning-rate schedule (step -> lr).
    """
    end = cfg.lr * cfg.end_lr_ratio
    if cfg.schedule == "cosine":
        decay = optax.cosine_decay_schedule(cfg.lr, cfg.decay_steps, alpha=cfg.end_lr_ratio)
    elif cfg.schedule == "linear":
        decay = optax.linear_schedule(cfg.lr, end, cfg.decay_steps)
    else:
        decay = optax.constant_schedule(cfg.lr)
    if cfg.warmup_steps > 0:
        sched = optax.join_schedules([optax.linear_schedule(0.0, cfg.lr, cfg.warmup_steps), decay], [cfg.warmup_steps])
    else:
        sched = decay
    parts = []
    if cfg.grad_clip_norm is not None:
        parts.append(optax.clip_by_global_norm(cfg.grad_clip_norm))
    parts.append(
        optax.adamw(
            sched,
            b1=cfg.b1,
            b2=cfg.b2,
            eps=cfg.eps,
            weight_decay=cfg.weight_decay,
            mask=lambda p: jax.tree.map(lambda x: x.ndim >= 2, p),
        )
    )
    return optax.chain(*parts), sched


def create_train_state(
    model: nnx.Module,
    optim: OptimizerConfig,
    ppo_cfg: PPOConfig | None = None,
    mesh: Mesh | None = None,
    rules=sharding.DEFAULT_RULES,
) -> TrainState:
    """Split `model` and initialise its optimiser.

    With a `mesh`, every array of the state (parameters, optimiser moments, step) is placed by the logical
    partition `rules` (`learner.sharding`); without one, arrays stay where they are.
    """
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    tx, sched = make_optimizer(optim)
    opt_state = jax.jit(tx.init)(params)
    state = TrainState(
        step=jnp.zeros((), jnp.int32),
        params=params,
        rest=rest,
        opt_state=opt_state,
        graphdef=graphdef,
        tx=tx,
        lr_schedule=sched,
        ppo=ppo_cfg if ppo_cfg is not None else PPOConfig(),
    )
    if mesh is not None:
        state = sharding.shard_tree(state, mesh, rules)
    return state


# ----------------------------------------------------------------------------------------------------------
# forward passes
# ----------------------------------------------------------------------------------------------------------


def token_stats(model: nnx.Module, seq: SequenceBatch, temperature: float, chunk: int = 0) -> tuple[Array, Array, Array]:
    """Token-aligned logprobs, entropies and top-1 hits (1 where the token is the argmax) `[b, T]` f32 of
    `model` on `seq` (`[b, T]`); all 0 at t = 0.

    When the model exposes `hidden_states` and `logits` (learner.model.Transformer) and `0 < chunk < T`, the
    output head runs `chunk` positions at a time under `jax.checkpoint`: `[b, T, V]` logits are never held
    at once (at T = 8192 and V = 151,936 they are 5 GB per sequence in float32). Otherwise one full call.
    """
    t = seq.tokens.shape[1]
    nxt = ppo.next_tokens(seq.tokens)

    def stats(logits, y):
        lp, ent = ppo.next_token_logprobs_and_entropy(logits, y, temperature)
        return lp, ent, (jnp.argmax(logits, axis=-1) == y).astype(jnp.float32)

    if not (chunk and chunk < t and hasattr(model, "hidden_states") and hasattr(model, "logits")):
        out = stats(model(seq.tokens, seq.positions, seq.segment_ids), nxt)
        return tuple(ppo.shift_right(x) for x in out)
    hidden = model.hidden_states(seq.tokens, seq.positions, seq.segment_ids)
    b = hidden.shape[0]
    pad = (-t) % chunk
    n = (t + pad) // chunk
    h = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0))).reshape(b, n, chunk, -1).swapaxes(0, 1)
    y = jnp.pad(nxt, ((0, 0), (0, pad))).reshape(b, n, chunk).swapaxes(0, 1)

    @jax.checkpoint
    def one(hc, yc):
        return stats(model.logits(hc), yc)

    out = jax.lax.map(lambda xs: one(*xs), (h, y))
    return tuple(ppo.shift_right(x.swapaxes(0, 1).reshape(b, t + pad)[:, :t]) for x in out)


def _policy_forward(graphdef, params, rest, seq: SequenceBatch, cfg: PPOConfig):
    model = nnx.merge(graphdef, params, rest)
    lp, ent, _ = token_stats(model, seq, cfg.temperature, cfg.logits_chunk_size)
    return lp, ent


def _critic_forward(graphdef, params, rest, seq: SequenceBatch):
    model = nnx.merge(graphdef, params, rest)
    return ppo.shift_right(model(seq.tokens, seq.positions, seq.segment_ids).astype(jnp.float32))


@jax.jit
def policy_logprobs(state: TrainState, seq: SequenceBatch) -> tuple[Array, Array]:
    """Token logprobs and entropies `[M, b, T]` f32 of the policy on `seq` (`[M, b, T]`), one microbatch at a
    time (the same computation as inside `policy_train_step`). Used for proximal and reference logprobs."""
    return jax.lax.map(lambda s: _policy_forward(state.graphdef, state.params, state.rest, s, state.ppo), seq)


@jax.jit
def critic_values(state: TrainState, seq: SequenceBatch) -> Array:
    """Token-aligned values V(tokens[:t]) `[M, b, T]` f32 of the critic on `seq` (`[M, b, T]`)."""
    return jax.lax.map(lambda s: _critic_forward(state.graphdef, state.params, state.rest, s), seq)


def _accumulate(loss_fn, params, batch, init_stats):
    """Scan `loss_fn(params, microbatch) -> (loss, stats)` over the leading axis, summing grads and stats."""
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

    def body(carry, mb):
        g_acc, s_acc = carry
        (_, stats), g = grad_fn(params, mb)
        s_new = {k: (jnp.maximum(s_acc[k], v) if k.endswith("_max") else s_acc[k] + v) for k, v in stats.items()}
        return (jax.tree.map(jnp.add, g_acc, g), s_new), None

    zeros = jax.tree.map(jnp.zeros_like, params)
    (grads, stats), _ = jax.lax.scan(body, (zeros, init_stats), batch)
    return grads, stats


def _apply(state: TrainState, grads) -> tuple[TrainState, Array, Array, Array]:
    """One optimiser step. A gradient that is not finite (NaN / inf anywhere: its global norm is not finite) is
    not applied: parameters, optimiser state and step count stay as they were (one NaN step would make every
    later parameter NaN). Returns (state, grad_norm, lr, skipped: 1.0 when the step was skipped, else 0.0)."""
    grad_norm = optax.tree.norm(grads)
    updates, opt_state = state.tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    lr = state.lr_schedule(state.step)
    finite = jnp.isfinite(grad_norm)
    keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(finite, a, b), new, old)  # noqa: E731
    new_state = state.replace(step=jnp.where(finite, state.step + 1, state.step), params=keep(params, state.params),
                              opt_state=keep(opt_state, state.opt_state))
    return new_state, grad_norm, lr, 1.0 - finite.astype(jnp.float32)


class NonFiniteRun:
    """Host-side count of optimiser steps (or whole updates) skipped in a row for a non-finite gradient (`_apply`'s
    `*/skipped_nonfinite`). `observe` raises FloatingPointError at `limit` in a row: the model's numerics are
    broken, and training on would change nothing. Used by the stage worker (per step) and the learner service (per
    PPO update)."""

    def __init__(self, who: str, unit: str, limit: int):
        self.who, self.unit, self.limit = who, unit, limit  # e.g. "stage warm_start", "step"
        self.in_a_row = 0
        self.total = 0

    def observe(self, skipped: bool, at: int) -> bool:
        """Record one step / update (`at`: its number); returns `skipped`. Raises FloatingPointError at `limit`
        skipped in a row."""
        if not skipped:
            self.in_a_row = 0
            return False
        self.in_a_row += 1
        self.total += 1
        log.warning("%s: %s %d had only non-finite gradients and was skipped (%d in a row)", self.who, self.unit, at,
                    self.in_a_row)
        if self.in_a_row >= self.limit:
            raise FloatingPointError(f"{self.who}: {self.in_a_row} {self.unit}s in a row had only non-finite gradients "
                                     f"(last: {self.unit} {at}); the model's numerics are broken")
        return True


# ----------------------------------------------------------------------------------------------------------
# steps
# ----------------------------------------------------------------------------------------------------------


@jax.jit
def policy_train_step(state: TrainState, batch: PolicyBatch) -> tuple[TrainState, dict[str, Array]]:
    """One optimiser step of the actor on a minibatch `[M, b, T]` (M microbatches accumulated).

    Loss (learner.ppo): token mean of the decoupled clipped surrogate - entropy_coef * entropy
    + kl_coef * KL(pi_theta || pi_ref). Metrics (`ppo/...`): policy_loss, entropy, clip_frac, dual_clip_frac,
    approx_kl (vs proximal), ratio_mean, ratio_dev_max (max |ratio - 1|), behaviour_weight_mean,
    behaviour_capped_frac, kl_ref, grad_norm (before clipping), lr, tokens, skipped_nonfinite (1.0: the step's
    gradient was not finite and was not applied, `_apply`).
    """
    cfg = state.ppo
    mask_all = batch.seq.loss_mask
    denom = jnp.maximum(jnp.sum(mask_all.astype(jnp.float32)), 1.0)
    use_kl = cfg.kl_coef > 0 and batch.ref_logprobs is not None

    def loss_fn(params, mb: PolicyBatch):
        logp, ent = _policy_forward(state.graphdef, params, state.rest, mb.seq, cfg)
        m = mb.seq.loss_mask
        if cfg.entropy_coef == 0:
            ent = jax.lax.stop_gradient(ent)
        t = ppo.policy_loss_terms(logp, mb.proximal_logprobs, mb.behaviour_logprobs, mb.advantages, m, cfg)
        pg = jnp.sum(t.loss)
        ent_sum = ppo.masked_sum(ent, m)
        total = pg - cfg.entropy_coef * ent_sum
        kl_sum = jnp.zeros(())
        if use_kl:
            kl_sum = jnp.sum(ppo.kl_penalty(logp, mb.ref_logprobs, m, cfg.kl_estimator))
            total = total + cfg.kl_coef * kl_sum
        mb_bool = m.astype(bool)
        stats = {
            "policy_loss": pg,
            "entropy": ent_sum,
            "clip_frac": jnp.sum(t.clipped),
            "dual_clip_frac": jnp.sum(t.dual_clipped),
            "approx_kl": jnp.sum(t.approx_kl),
            "ratio_mean": jnp.sum(t.ratio),
            "ratio_dev_max": jnp.max(jnp.where(mb_bool, jnp.abs(t.ratio - 1.0), 0.0)),
            "behaviour_weight_mean": jnp.sum(t.behaviour_weight),
            "behaviour_capped_frac": jnp.sum(t.behaviour_capped),
            "kl_ref": kl_sum,
        }
        return total / denom, stats

    init = {k: jnp.zeros(()) for k in (
        "policy_loss", "entropy", "clip_frac", "dual_clip_frac", "approx_kl", "ratio_mean",
        "ratio_dev_max", "behaviour_weight_mean", "behaviour_capped_frac", "kl_ref")}
    grads, stats = _accumulate(loss_fn, state.params, batch, init)
    new_state, grad_norm, lr, skipped = _apply(state, grads)
    metrics = {f"ppo/{k}": (v if k.endswith("_max") else v / denom) for k, v in stats.items()}
    metrics.update({"ppo/grad_norm": grad_norm, "ppo/lr": lr, "ppo/tokens": denom, "ppo/skipped_nonfinite": skipped})
    return new_state, metrics


@jax.jit
def critic_train_step(state: TrainState, batch: CriticBatch) -> tuple[TrainState, dict[str, Array]]:
    """One optimiser step of the critic on `[M, b, T]`: token mean of the clipped value loss
    (`state.ppo.value_clip_eps`; learner.ppo.value_loss_terms). Metrics (`critic/...`): value_loss,
    value_clip_frac, value_mean, return_mean, grad_norm, lr, skipped_nonfinite (see `_apply`)."""
    cfg = state.ppo
    denom = jnp.maximum(jnp.sum(batch.seq.loss_mask.astype(jnp.float32)), 1.0)

    def loss_fn(params, mb: CriticBatch):
        v = _critic_forward(state.graphdef, params, state.rest, mb.seq)
        m = mb.seq.loss_mask
        t = ppo.value_loss_terms(v, mb.old_values, mb.returns, m, cfg.value_clip_eps)
        stats = {
            "value_loss": jnp.sum(t.loss),
            "value_clip_frac": jnp.sum(t.clipped),
            "value_mean": ppo.masked_sum(v, m),
            "return_mean": ppo.masked_sum(mb.returns, m),
        }
        return stats["value_loss"] / denom, stats

    init = {k: jnp.zeros(()) for k in ("value_loss", "value_clip_frac", "value_mean", "return_mean")}
    grads, stats = _accumulate(loss_fn, state.params, batch, init)
    new_state, grad_norm, lr, skipped = _apply(state, grads)
    metrics = {f"critic/{k}": v / denom for k, v in stats.items()}
    metrics.update({"critic/grad_norm": grad_norm, "critic/lr": lr, "critic/skipped_nonfinite": skipped})
    return new_state, metrics


@jax.jit
def sft_train_step(state: TrainState, batch: SequenceBatch) -> tuple[TrainState, dict[str, Array]]:
    """One optimiser step of supervised fine-tuning on `[M, b, T]`: token-mean negative log-likelihood of the
    loss-mask tokens (stage 0 warm start on demonstrations, stage 2 RFT). Metrics (`sft/...`): nll, accuracy
    (argmax == target), grad_norm, lr, tokens, skipped_nonfinite (see `_apply`)."""
    denom = jnp.maximum(jnp.sum(batch.loss_mask.astype(jnp.float32)), 1.0)

    def loss_fn(params, seq: SequenceBatch):
        model = nnx.merge(state.graphdef, params, state.rest)
        logp, _, correct = token_stats(model, seq, 1.0, state.ppo.logits_chunk_size)
        nll = -ppo.masked_sum(logp, seq.loss_mask)
        return nll / denom, {"nll": nll, "accuracy": ppo.masked_sum(correct, seq.loss_mask)}

    grads, stats = _accumulate(loss_fn, state.params, batch, {"nll": jnp.zeros(()), "accuracy": jnp.zeros(())})
    new_state, grad_norm, lr, skipped = _apply(state, grads)
    metrics = {f"sft/{k}": v / denom for k, v in stats.items()}
    metrics.update({"sft/grad_norm": grad_norm, "sft/lr": lr, "sft/tokens": denom, "sft/skipped_nonfinite": skipped})
    return new_state, metrics


# ----------------------------------------------------------------------------------------------------------
# the PPO update driver
# ----------------------------------------------------------------------------------------------------------


@struct.dataclass
class RolloutBatch:
    """One PPO update's data, rows `[N, T]` (N a multiple of the minibatch size; empty rows have loss_mask 0).

    `rewards` are token-level f32 (the final reward on each trajectory's last policy token); `baselines`, with
    `ppo.baseline="group"`, each trajectory's group baseline on all its policy tokens (`learner.batch`); the rest
    as in `SequenceBatch` / `PolicyBatch`.
    """

    seq: SequenceBatch
    behaviour_logprobs: Array
    rewards: Array
    baselines: Array | None = None


def _micro(x: Array, micro: int) -> Array:
    return x.reshape((x.shape[0] // micro, micro) + x.shape[1:])


@jax.jit
def _take_rows(tree, idx: Array):
    return jax.tree.map(lambda x: jnp.take(x, idx, axis=0), tree)


def compute_advantages(rollout: RolloutBatch, values: Array, cfg: PPOConfig) -> tuple[Array, Array, Array]:
    """(raw advantages, advantages whitened over the batch's policy tokens when `cfg.normalize_advantages`,
    the critic's returns), each `[N, T]` f32. Returns are GAE's (`ppo.gae` with the critic's values). Advantages
    are GAE's with `cfg.baseline="critic"`; with "group" they are the discounted return of the final reward less
    the trajectory's group baseline (`rollout.baselines`), gamma^k (R - b) with k the policy tokens after this
    one, and normalisation only scales them (a group of equal rewards stays at 0).

    Raises ValueError when `cfg.baseline` is "group" and the batch has no baselines."""
    adv, ret = ppo.gae(rollout.rewards, values, rollout.seq.loss_mask, cfg.gamma, cfg.lam, rollout.seq.segment_ids)
    if cfg.baseline == "group":
        if rollout.baselines is None:
            raise ValueError("ppo.baseline='group' needs the batch's group baselines (pack_trajectories(..., "
                             "group_baselines=True))")
        mask, segs, zeros = rollout.seq.loss_mask, rollout.seq.segment_ids, jnp.zeros_like(values)
        # the baseline stands in for a final reward: on the trajectory's last policy token, discounted like it, so a
        # trajectory whose reward equals its baseline has advantage 0 on every token for any gamma
        _, left = ppo.gae(mask, zeros, mask, 1.0, 1.0, segs)  # policy tokens from here to the trajectory's end
        last_b = jnp.where((mask > 0) & (left == 1), rollout.baselines, 0.0)
        _, adv = ppo.gae(rollout.rewards - last_b, zeros, mask, cfg.gamma, 1.0, segs)
        adv = adv * mask
    if not cfg.normalize_advantages:
        used = adv
    elif cfg.baseline == "group":  # scaled, not centred: centring would move a group of equal rewards off 0
        used = _scale(adv, rollout.seq.loss_mask)
    else:
        used = _whiten(adv, rollout.seq.loss_mask)
    return adv, used, ret


_whiten = jax.jit(ppo.masked_whiten)


@jax.jit
def _scale(x: Array, mask: Array, eps: float = 1e-8) -> Array:
    """x over its standard deviation on the mask's positions (not centred), 0 elsewhere."""
    return jnp.where(mask.astype(bool), x * jax.lax.rsqrt(ppo.masked_var(x, mask) + eps), 0.0)


@jax.jit
def _prep_metrics(values, adv_raw, ret, prox, behav, mask):
    return {
        "ppo/explained_variance": ppo.explained_variance(values, ret, mask),
        "ppo/advantage_mean": ppo.masked_mean(adv_raw, mask),
        "ppo/advantage_std": jnp.sqrt(ppo.masked_var(adv_raw, mask)),
        "ppo/return_mean": ppo.masked_mean(ret, mask),
        "ppo/value_mean": ppo.masked_mean(values, mask),
        # mean log(pi_prox / pi_behav) over policy tokens: how far the actors' policies lag the learner
        "ppo/behaviour_log_ratio_mean": ppo.masked_mean(prox - behav, mask),
    }


def ppo_update(
    policy: TrainState,
    critic: TrainState,
    rollout: RolloutBatch,
    key: Array,
    ref_params: Any = None,
    mesh: Mesh | None = None,
) -> tuple[TrainState, TrainState, dict[str, float]]:
    """One PPO update on a rollout batch (Python loop over jitted steps).

    1. critic values, proximal logprobs pi_prox (current policy, the same microbatch computation as the
       train step) and, when `ref_params` is given and kl_coef > 0, reference logprobs;
    2. GAE over policy tokens and advantage whitening;
    3. `ppo.epochs` passes over shuffled minibatches of `ppo.minibatch_size` rows, each a `policy_train_step`
       and a `critic_train_step` with `ppo.minibatch_size / ppo.microbatch_size` accumulated microbatches.

    Args:
      policy, critic: train states (policy.ppo holds the settings).
      rollout: `[N, T]` rows; N must be a multiple of `ppo.minibatch_size`.
      key: PRNG key for the minibatch shuffle.
      ref_params: nnx.State of the frozen reference policy (same graphdef as `policy`), or None.
      mesh: when given, every microbatch `[M, b, T]` is laid out with its b rows on (data, fsdp); b must be
        divisible by data * fsdp.
    Returns the new states and metrics averaged over the minibatches, plus `ppo/explained_variance`
    (critic values at update start vs returns), advantage and return statistics and `ppo/update_tokens_per_s`.
    Raises ValueError when N is not a multiple of the minibatch size.
    """
    cfg = policy.ppo
    t0 = time.perf_counter()
    n = rollout.seq.tokens.shape[0]
    if n % cfg.minibatch_size:
        raise ValueError(f"rollout has {n} rows, not a multiple of ppo.minibatch_size={cfg.minibatch_size}")
    micro = cfg.microbatch_size

    def to_micro(tree):
        tree = jax.tree.map(lambda x: _micro(x, micro), tree)
        return tree if mesh is None else sharding.shard_batch(tree, mesh, row_axis=1)

    seq_m = to_micro(rollout.seq)
    values = critic_values(critic, seq_m).reshape(rollout.seq.tokens.shape)
    prox, _ = policy_logprobs(policy, seq_m)
    prox = prox.reshape(rollout.seq.tokens.shape)
    ref = None
    if ref_params is not None and cfg.kl_coef > 0:
        ref, _ = policy_logprobs(policy.replace(params=ref_params), seq_m)
        ref = ref.reshape(rollout.seq.tokens.shape)
    adv_raw, adv, ret = compute_advantages(rollout, values, cfg)
    prep = _prep_metrics(values, adv_raw, ret, prox, rollout.behaviour_logprobs, rollout.seq.loss_mask)

    full = PolicyBatch(rollout.seq, rollout.behaviour_logprobs, prox, adv, ref)
    full_critic = CriticBatch(rollout.seq, ret, values)
    per_step = []
    steps_per_epoch = n // cfg.minibatch_size
    for _ in range(cfg.epochs):
        key, sub = jax.random.split(key)
        perm = jax.random.permutation(sub, n)
        for i in range(steps_per_epoch):
            idx = perm[i * cfg.minibatch_size : (i + 1) * cfg.minibatch_size]
            pb, cb = _take_rows((full, full_critic), idx)
            pb, cb = to_micro(pb), to_micro(cb)
            policy, pm = policy_train_step(policy, pb)
            critic, cm = critic_train_step(critic, cb)
            per_step.append({**pm, **cm})
    per_step, prep = jax.device_get((per_step, prep))  # one sync at the end of the update
    metrics = {}
    for k in per_step[0]:
        col = np.asarray([float(m[k]) for m in per_step])
        metrics[k] = float(col.max() if k.endswith("_max") else col.mean())
    metrics.update({k: float(v) for k, v in prep.items()})
    jax.block_until_ready((policy.params, critic.params))
    dt = time.perf_counter() - t0
    n_tokens = float(jnp.sum(rollout.seq.segment_ids > 0)) * cfg.epochs
    metrics["ppo/update_tokens_per_s"] = n_tokens / dt
    metrics["ppo/update_s"] = dt
    return policy, critic, metrics
