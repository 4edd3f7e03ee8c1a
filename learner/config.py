"""Typed configuration of the learner: PPO, optimisers, mesh, checkpoints, buffer, stages.

All dataclasses are frozen (hashable): the PPO and optimiser settings ride as static fields of the jitted
train state, so equal configs share compiled code. Load them with `cuda_agent.config.load_config(LearnerConfig,
path, overrides)`; presets live in `configs/`.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

# learner.model.ModelConfig.remat_policy's values (here, so configs can name them without importing JAX)
REMAT_POLICIES = ("full", "save_dots")

KL_ESTIMATORS = ("k1", "k2", "k3")
BEHAVIOUR_WEIGHT_MODES = ("truncate", "mask")
BASELINES = ("critic", "group")
LR_SCHEDULES = ("cosine", "linear", "constant")
STAGES = ("warm_start", "single_turn_ppo", "rft", "value_pretrain", "multi_turn_ppo")


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


@dataclasses.dataclass(frozen=True)
class PPOConfig:
    """Loss and advantage settings of PPO (see `learner.ppo` for the formulas)."""

    clip_eps: float = 0.2
    """Lower clip range of the ratio pi_theta / pi_prox: the ratio is clipped to [1 - clip_eps, 1 + clip_eps_high]."""
    clip_eps_high: Optional[float] = None
    """Upper clip range; None means clip_eps (symmetric clipping)."""
    dual_clip_c: Optional[float] = None
    """Dual-clip constant c > 1 (Ye et al. 2020) bounding the loss of negative-advantage tokens; None = off."""
    value_clip_eps: Optional[float] = 0.2
    """Clip range of the critic's new values around the values at update start; None = unclipped value loss."""
    gamma: float = 1.0
    """Discount per policy token (observation tokens do not discount; see `learner.ppo.gae`)."""
    lam: float = 0.95
    """GAE lambda."""
    baseline: str = "critic"
    """What the return is compared with to form the advantage. critic: GAE over the critic's values (Schulman et
    al. 2016). group: the leave-one-out mean final reward of the other trajectories of the same task in the update
    batch (RLOO: Kool et al. 2019; Ahmadian et al. 2024), the same advantage on every policy token of a
    trajectory, no critic involved (the critic still trains on the returns); a trajectory with no other of its task
    in the batch is compared with all the others. Actors then sample each task `actor.group_size` times in a row.
    A group whose trajectories all have the same reward gives no gradient (`normalize_advantages` then scales the
    advantages without centring them), where whitened rewards against an untrained critic push its tokens down
    (RESULTS.md, session 21)."""
    normalize_advantages: bool = True
    """Whiten advantages over the policy tokens of the whole update batch (mean 0, std 1)."""
    entropy_coef: float = 0.0
    """Weight of the entropy bonus (subtracted from the policy loss)."""
    kl_coef: float = 0.0
    """Weight of the KL penalty to the frozen reference policy (added to the policy loss); 0 = no reference.
    Cost when on: the learner keeps a copy of the initial policy parameters on the devices (4 bytes per
    parameter in float32: 2 GB for a 0.5B model, 30 GB for 7B; sharded like the policy) and runs one extra
    forward pass over each update batch for the reference logprobs; the copy is also checkpointed."""
    kl_estimator: str = "k3"
    """KL estimator per token, with r = pi_ref / pi_theta: k1 = -log r, k2 = (log r)^2 / 2, k3 = r - 1 - log r."""
    decoupled: bool = True
    """Decoupled PPO (AReaL): clip against proximal logprobs recomputed at update start and weight tokens by
    pi_prox / pi_behav. False = classic PPO that clips against the behaviour logprobs directly."""
    behaviour_weight_cap: Optional[float] = 5.0
    """Cap C of the importance weight pi_prox / pi_behav; None = uncapped."""
    behaviour_weight_mode: str = "truncate"
    """How the cap applies: truncate = min(w, C); mask = drop tokens with w > C (AReaL's code)."""
    temperature: float = 1.0
    """Sampling temperature of the actors; learner logprobs use the same temperature."""
    max_policy_lag: int = 4
    """A trajectory sampled with policy version v is dropped (and counted) when current version - v exceeds this."""
    epochs: int = 1
    """Passes over each update batch."""
    minibatch_size: int = 8
    """Sequences (rows) per optimiser step."""
    microbatch_size: int = 8
    """Sequences per forward/backward pass; minibatch_size / microbatch_size gradients are accumulated."""
    logits_chunk_size: int = 1024
    """Compute setting: logprobs and entropies are taken this many positions at a time from the final hidden
    states (recomputed in the backward pass), so `[b, T, V]` logits never exist at once; 0 = all at once."""

    def __post_init__(self):
        _check(0 < self.clip_eps < 1, f"clip_eps must be in (0, 1), got {self.clip_eps}")
        _check(self.clip_eps_high is None or self.clip_eps_high > 0, "clip_eps_high must be > 0 or None")
        _check(self.dual_clip_c is None or self.dual_clip_c > 1, f"dual_clip_c must be > 1 or None, got {self.dual_clip_c}")
        _check(self.value_clip_eps is None or self.value_clip_eps > 0, "value_clip_eps must be > 0 or None")
        _check(0 <= self.gamma <= 1, f"gamma must be in [0, 1], got {self.gamma}")
        _check(0 <= self.lam <= 1, f"lam must be in [0, 1], got {self.lam}")
        _check(self.entropy_coef >= 0 and self.kl_coef >= 0, "entropy_coef and kl_coef must be >= 0")
        _check(self.kl_estimator in KL_ESTIMATORS, f"kl_estimator must be one of {KL_ESTIMATORS}, got {self.kl_estimator!r}")
        _check(self.behaviour_weight_cap is None or self.behaviour_weight_cap >= 1, "behaviour_weight_cap must be >= 1 or None")
        _check(
            self.behaviour_weight_mode in BEHAVIOUR_WEIGHT_MODES,
            f"behaviour_weight_mode must be one of {BEHAVIOUR_WEIGHT_MODES}, got {self.behaviour_weight_mode!r}",
        )
        _check(self.baseline in BASELINES, f"baseline must be one of {BASELINES}, got {self.baseline!r}")
        _check(self.temperature > 0, f"temperature must be > 0, got {self.temperature}")
        _check(self.max_policy_lag >= 0, f"max_policy_lag must be >= 0, got {self.max_policy_lag}")
        _check(self.epochs >= 1, f"epochs must be >= 1, got {self.epochs}")
        _check(self.minibatch_size >= 1 and self.microbatch_size >= 1, "minibatch_size and microbatch_size must be >= 1")
        _check(self.logits_chunk_size >= 0, f"logits_chunk_size must be >= 0, got {self.logits_chunk_size}")
        _check(
            self.minibatch_size % self.microbatch_size == 0,
            f"minibatch_size ({self.minibatch_size}) must be a multiple of microbatch_size ({self.microbatch_size})",
        )

    @property
    def grad_accum_steps(self) -> int:
        return self.minibatch_size // self.microbatch_size


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    """AdamW with global-norm gradient clipping and a warm-up + decay learning-rate schedule (Optax)."""

    lr: float = 1e-6
    """Peak learning rate (reached at the end of warm-up)."""
    warmup_steps: int = 10
    """Optimiser steps of linear warm-up from 0 to lr."""
    decay_steps: int = 10_000
    """Optimiser steps of decay after warm-up (ignored by the constant schedule)."""
    schedule: str = "cosine"
    """Decay shape after warm-up: cosine, linear or constant."""
    end_lr_ratio: float = 0.1
    """Final learning rate as a fraction of lr."""
    weight_decay: float = 0.0
    """Decoupled weight decay (AdamW)."""
    b1: float = 0.9
    b2: float = 0.95
    eps: float = 1e-8
    grad_clip_norm: Optional[float] = 1.0
    """Clip gradients to this global L2 norm; None = no clipping."""

    def __post_init__(self):
        _check(self.lr >= 0, f"lr must be >= 0, got {self.lr}")
        _check(self.warmup_steps >= 0 and self.decay_steps >= 1, "warmup_steps must be >= 0 and decay_steps >= 1")
        _check(self.schedule in LR_SCHEDULES, f"schedule must be one of {LR_SCHEDULES}, got {self.schedule!r}")
        _check(0 <= self.end_lr_ratio <= 1, f"end_lr_ratio must be in [0, 1], got {self.end_lr_ratio}")
        _check(self.weight_decay >= 0, "weight_decay must be >= 0")
        _check(0 <= self.b1 < 1 and 0 <= self.b2 < 1 and self.eps > 0, "need 0 <= b1, b2 < 1 and eps > 0")
        _check(self.grad_clip_norm is None or self.grad_clip_norm > 0, "grad_clip_norm must be > 0 or None")


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """Device mesh (data, fsdp, tensor). One axis may be -1: it takes the devices the others leave."""

    data: int = 1
    fsdp: int = -1
    tensor: int = 1

    def __post_init__(self):
        sizes = (self.data, self.fsdp, self.tensor)
        _check(all(s == -1 or s >= 1 for s in sizes), f"mesh sizes must be >= 1 or -1, got {sizes}")
        _check(sum(s == -1 for s in sizes) <= 1, f"at most one mesh axis may be -1, got {sizes}")


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
    """Orbax checkpoints of the learner."""

    directory: str = "checkpoints"
    """Folder of the CheckpointManager (relative paths are under the run folder)."""
    max_to_keep: int = 3
    """Keep the newest N checkpoints."""
    every_updates: int = 50
    """Save every M PPO updates (0 = not by count); a run also saves at its end and on SIGTERM."""
    every_s: float = 0.0
    """Also save when this many seconds have passed since the last save (0 = not by time). A 0.5B policy and
    critic with their Adam state block an update for about 8 s on the H200 (RESULTS, session 17): on a fast
    learner, time is the better measure."""
    async_save: bool = True
    """Write in a background thread so that training continues while the checkpoint is committed."""

    def __post_init__(self):
        _check(self.max_to_keep >= 1, "max_to_keep must be >= 1")
        _check(self.every_updates >= 0 and self.every_s >= 0,
               f"every_updates and every_s must be >= 0, got {self.every_updates} and {self.every_s}")

    def due(self, update: int, since_last_s: float) -> bool:
        """Whether update `update` (1-based) should be followed by a save, `since_last_s` seconds after the last."""
        return bool((self.every_updates and update % self.every_updates == 0)
                    or (self.every_s and since_last_s >= self.every_s))


@dataclasses.dataclass(frozen=True)
class StageConfig:
    """The paper's training stages, learner side (Section 3 of arXiv 2602.24286)."""

    rft_reward_threshold: float = 1.0
    """RFT keeps warm-up trajectories whose final reward is >= this (milestone reward: 1 = faster than eager)."""
    sft_epochs: int = 1
    """Epochs of supervised training (warm start and RFT)."""
    value_pretrain_steps: int = 100
    """Critic optimiser steps of value pre-training on the RFT trajectories' returns."""
    single_turn_max_turns: int = 1
    multi_turn_max_turns: int = 200
    """Turn limit of agentic episodes (the paper: 200)."""
    max_context_tokens: int = 131_072
    """Context limit of an episode in tokens (the paper: 128k)."""

    def __post_init__(self):
        _check(self.sft_epochs >= 1 and self.value_pretrain_steps >= 0, "sft_epochs >= 1 and value_pretrain_steps >= 0")
        _check(self.single_turn_max_turns >= 1 and self.multi_turn_max_turns >= 1, "turn limits must be >= 1")
        _check(self.max_context_tokens >= 2, "max_context_tokens must be >= 2")


@dataclasses.dataclass(frozen=True)
class LearnerConfig:
    """Everything the learner needs besides the model config."""

    ppo: PPOConfig = dataclasses.field(default_factory=PPOConfig)
    policy_optim: OptimizerConfig = dataclasses.field(default_factory=OptimizerConfig)
    critic_optim: OptimizerConfig = dataclasses.field(default_factory=lambda: OptimizerConfig(lr=5e-6))
    mesh: MeshConfig = dataclasses.field(default_factory=MeshConfig)
    checkpoint: CheckpointConfig = dataclasses.field(default_factory=CheckpointConfig)
    stages: StageConfig = dataclasses.field(default_factory=StageConfig)
    seed: int = 0
    """Seed of parameter init and minibatch shuffling."""
    max_seq_len: int = 8192
    """Longest row of update batches in tokens; longer trajectories are refused (counted) by the batch builder."""
    min_row_len: int = 1024
    """With packing, an update's rows may be shorter than max_seq_len: max_seq_len / 2**k, no shorter than this
    (nor than the longest trajectory), whichever wastes the fewest padded positions (`learner.batch.pick_row_len`).
    Each distinct length compiles the update's steps once. 0 would allow any power-of-two fraction; set it to
    max_seq_len to keep every row max_seq_len long."""
    pack_sequences: bool = True
    """Pack several trajectories into one row (segment ids) instead of one trajectory per padded row.
    (Rematerialisation for long trajectories is the model's setting: `learner.model.ModelConfig.remat`; the
    output head is chunked by `ppo.logits_chunk_size`.)"""
    batch_trajectories: int = 64
    """Trajectories per PPO update."""
    buffer_capacity: int = 1024
    """Bound of the trajectory buffer (trajectories)."""
    publish_every_updates: int = 1
    """Publish weights to the actors every K updates."""
    metrics_dir: str = "metrics"
    """JSONL + TensorBoard folder (relative paths are under the run folder)."""

    def __post_init__(self):
        _check(self.max_seq_len >= 2, "max_seq_len must be >= 2")
        _check(self.batch_trajectories >= 1, "batch_trajectories must be >= 1")
        _check(self.buffer_capacity >= self.batch_trajectories, "buffer_capacity must be >= batch_trajectories")
        _check(self.min_row_len >= 0, f"min_row_len must be >= 0, got {self.min_row_len}")
        _check(self.publish_every_updates >= 1, "publish_every_updates must be >= 1")


PUBLISH_DTYPES = ("float32", "bfloat16")


@dataclasses.dataclass(frozen=True)
class ServiceConfig:
    """The learner service (`cuda-agent learner serve`): endpoints, stage and budgets."""

    trajectories: str = "tcp://*:5555"
    """Where the acked trajectory channel binds (ROUTER)."""
    weights: str = "tcp://*:5556"
    """Where the weights publisher binds (ROUTER)."""
    stage: str = "multi_turn_ppo"
    """PPO stage served: single_turn_ppo or multi_turn_ppo (turn limits from StageConfig)."""
    max_updates: int = 0
    """Stop after this many PPO updates in this stage (0 = until stopped)."""
    time_budget_s: float = 0.0
    """Stop after this many seconds (0 = no limit)."""
    publish_dtype: Optional[str] = None
    """Cast weights to this dtype for the actors (float32 / bfloat16); None = the parameters' dtype."""
    read_timeout_s: float = 0.5
    """How long one poll of the spool waits for new trajectories."""
    curve: str = "auto"
    """CURVE on both channels: "auto" (on when an endpoint is reachable beyond loopback), "always", "never"."""
    curve_secret_key: str = ""
    """The learner's CURVE secret key file (`<dir>/server.key_secret`; `cuda-agent learner keys DIR` makes it)."""
    curve_authorized_keys: str = ""
    """Folder of the public key files of the actors allowed in."""

    def __post_init__(self):
        _check(self.curve in ("auto", "always", "never"),
               f"service curve must be one of ('auto', 'always', 'never'), got {self.curve!r}")
        _check(self.stage in ("single_turn_ppo", "multi_turn_ppo"),
               f"service stage must be single_turn_ppo or multi_turn_ppo, got {self.stage!r}")
        _check(self.max_updates >= 0 and self.time_budget_s >= 0, "max_updates and time_budget_s must be >= 0")
        _check(self.publish_dtype is None or self.publish_dtype in PUBLISH_DTYPES,
               f"publish_dtype must be one of {PUBLISH_DTYPES} or None, got {self.publish_dtype!r}")
        _check(self.read_timeout_s >= 0, "read_timeout_s must be >= 0")
