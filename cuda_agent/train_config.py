"""`TrainConfig`: everything `cuda-agent train` needs, typed. Presets in `configs/` (`local` is the default, `smoke`
for CI, `h200` for one GPU host, `multihost` as an example); any field can be overridden on the command line as
`a.b=value`. Merge order: these dataclass defaults < the preset's YAML < the overrides
(`cuda_agent.config.load_config`). The resolved config is saved as `config.yaml` in the run folder.

The components keep their own config dataclasses and are embedded whole, so every knob stays reachable:
`learner.*` (learner.config.LearnerConfig: PPO, optimisers, mesh, checkpoints), `actor.*`
(actors.config.ActorConfig: concurrency and the agent loop), `node.*` (sandbox.service.ServiceConfig, with the
sandbox pipeline under `node.sandbox.*`).
"""

from __future__ import annotations

import dataclasses
from typing import List, Optional

from actors.config import ActorConfig
from learner.config import REMAT_POLICIES, LearnerConfig
from sandbox.service import ServiceConfig

DEVICES = ("auto", "cpu", "cuda")
MODEL_INITS = ("scratch", "hf")
STAGE_NAMES = ("warm_start", "single_turn_ppo", "rft", "value_pretrain", "multi_turn_ppo")
EVAL_MODES = ("single_turn", "multi_turn")


def _check(ok: bool, msg: str) -> None:
    if not ok:
        raise ValueError(msg)


def _at_least(spec: object, where: str, **lows: float) -> None:
    """ValueError naming the key and its value for the first field of `spec` below its lower bound."""
    for name, lo in lows.items():
        value = getattr(spec, name)
        _check(value >= lo, f"{where}.{name} must be >= {lo:g}, got {value!r}")


def _positive(spec: object, where: str, *names: str) -> None:
    for name in names:
        value = getattr(spec, name)
        _check(value > 0, f"{where}.{name} must be > 0, got {value!r}")


@dataclasses.dataclass
class ModelSpec:
    """The policy network. `scratch`: a small Qwen2-layout transformer initialised at random with the fields
    below (vocab from the tokenizer); `hf`: a Hugging Face checkpoint folder (config.json, safetensors,
    tokenizer.json), e.g. one trained here and exported, for the h200 preset."""

    init: str = "scratch"
    """"scratch" or "hf"."""
    hf_path: str = ""
    """Checkpoint folder for init=hf."""
    hidden_size: int = 192
    num_layers: int = 3
    num_heads: int = 6
    num_kv_heads: int = 2
    head_dim: int = 32
    intermediate_size: int = 512
    max_position_embeddings: int = 8192
    dtype: str = "float32"
    """Compute dtype ("float32" or "bfloat16")."""
    param_dtype: str = "float32"
    remat: bool = False
    remat_policy: str = "full"
    """What a rematerialised layer keeps (learner.config.REMAT_POLICIES): "full" (only its input) or "save_dots"
    (its projection matmuls' outputs too: faster, more memory)."""
    attention_impl: str = "xla"

    def __post_init__(self) -> None:
        _check(self.init in MODEL_INITS, f"model.init must be one of {MODEL_INITS}, got {self.init!r}")
        _check(self.init != "hf" or bool(self.hf_path), "model.init=hf needs model.hf_path (a checkpoint folder)")
        _check(self.remat_policy in REMAT_POLICIES,
               f"model.remat_policy must be one of {REMAT_POLICIES}, got {self.remat_policy!r}")
        for name in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim", "intermediate_size",
                     "max_position_embeddings"):
            _check(getattr(self, name) > 0, f"model.{name} must be > 0, got {getattr(self, name)}")


@dataclasses.dataclass
class TokenizerSpec:
    """The tokenizer: a tokenizer.json, or a byte-level BPE trained on the built-in corpus (skill text, task
    sources, demonstrations) when `path` is empty and the model is trained from scratch."""

    path: str = ""
    """A tokenizer.json to use as it is ("" = train one)."""
    vocab_size: int = 4096
    """Most ids of a trained tokenizer (fewer when the corpus has no more merges at min_frequency)."""
    min_frequency: int = 2
    """Merges seen fewer times than this in the corpus are not made."""
    split: str = "words"
    """Pre-tokenization (learner.tokenizer.SPLITS): "words" (GPT-2's regex), "digits" (merges across spaces and
    punctuation, digits one by one: several times fewer tokens on code) or "lines" ("digits" that also keeps line
    breaks, indentation and comment markers apart, so a copied line tokenizes as in the prompt)."""
    max_token_length: int = 0
    """Longest merged token in characters (0 = no limit)."""

    def __post_init__(self) -> None:
        from learner.tokenizer import SPLITS

        _check(self.vocab_size >= 512, f"tokenizer.vocab_size must be >= 512, got {self.vocab_size}")
        _check(self.split in SPLITS, f"tokenizer.split must be one of {SPLITS}, got {self.split!r}")
        _check(self.max_token_length >= 0, "tokenizer.max_token_length must be >= 0")


@dataclasses.dataclass
class TaskSpec:
    """Which tasks train and which evaluate. Splits are those of `tasks.builtin` ("auto" picks the cpu_* or gpu_*
    splits from the device), or paths (KernelBench folder, .jsonl, .py folder)."""

    train: List[str] = dataclasses.field(default_factory=lambda: ["single_op", "auto_train"])
    """Training task sources: built-in split names, "auto_train" (cpu_train or gpu_train), or paths."""
    eval: str = "auto_eval"
    """The fixed evaluation split (tasks with no demonstrations): a split name, "auto_eval", or a path."""
    format: str = "auto"
    """Solution format: "cpu", "cubin", "extension", or "auto" (cubin on a GPU, cpu otherwise)."""
    max_train_tasks: int = 0
    """Use at most this many training tasks (0 = all), chosen with the run seed."""
    max_eval_tasks: int = 0
    """Use at most this many evaluation tasks (0 = all; the first N in file order, fixed across runs)."""
    rollout_demo_tasks_only: bool = False
    """PPO rollouts only on training tasks that have demonstrations (easier tasks for a small model)."""
    rollout_composed: int = 0
    """PPO rollouts on this many fresh compositions of the demonstration family instead of the training tasks:
    no demonstration of them is trained on, their operator chains are in neither the warm start's composed tasks
    nor the evaluation split (cuda_agent.corpus.composed_tasks, ids "fresh_*"). The reward then comes from the
    kind of task the evaluation split holds, solved without a demonstration. 0 = rollouts on the training tasks."""

    def __post_init__(self) -> None:
        _check(self.format in ("auto", "cpu", "cubin", "extension"), f"tasks.format: unknown {self.format!r}")
        _at_least(self, "tasks", max_train_tasks=0, max_eval_tasks=0, rollout_composed=0)
        _check(not (self.rollout_composed and self.rollout_demo_tasks_only),
               "tasks.rollout_composed and tasks.rollout_demo_tasks_only choose different rollout tasks: set one")


@dataclasses.dataclass
class WarmStartSpec:
    """Stage 0: supervised warm start on demonstrations (both single-turn and multi-turn renderings)."""

    enabled: bool = True
    steps: int = 200
    """Optimiser steps (each `batch_rows` rows)."""
    batch_rows: int = 8
    microbatch_rows: int = 0
    """Rows per forward/backward pass of a step (gradients summed over the passes: the same update); 0 = all
    `batch_rows` at once. On the 2-core CPU box 2-row passes of 4-row steps were 15% faster than one pass
    (benchmarks/RESULTS.md, session 30). Rounded down to a divisor of batch_rows."""
    lr: float = 3e-3
    warmup_steps: int = 20
    max_seq_len: int = 4096
    """Demonstrations longer than this (in tokens) are left out (counted in the metrics)."""
    row_len: int = 0
    """Tokens per packed training row (several demonstrations share a row, attention stays within each); 0 = the
    longest demonstration rounded up to a multiple of 256. At most max_seq_len."""
    time_budget_s: float = 600.0
    """Stop early after this long (the stage still ends with a checkpoint)."""
    variants: List[str] = dataclasses.field(default_factory=lambda: ["fused", "fast", "naive"])
    """Demonstration variants used."""
    composed_tasks: int = 0
    """Extra warm-start tasks composed for the run (cuda_agent.corpus.composed_tasks: the demonstration family's
    operators, never an evaluation task's operator chain), each with its demonstration of `variants`, rendered
    single-turn (and multi-turn too: composed_multi_turn); they are not rollout tasks. Many fresh compositions
    instead of many epochs over a few hundred tasks: a small model then learns the translation instead of
    memorising the tasks."""
    composed_multi_turn: float = 0.0
    """Fraction (0-1) of the composed tasks also rendered as multi-turn chats (the agent loop's system prompt and
    tool syntax; cuda_agent.corpus.demo_messages): the first round(fraction x composed_tasks) of them (Python's
    round: half to even) in their composed order. 0 = single-turn only: the multi-turn prompt then has only the
    training tasks' demonstrations (a few hundred). With 1, one seed's agent-loop held-out pass rate was 5.5 points
    higher, within the noise of two warm starts (benchmarks/RESULTS.md, session 30)."""

    def __post_init__(self) -> None:
        _at_least(self, "stages.warm_start", steps=0, batch_rows=1, max_seq_len=16, lr=0, warmup_steps=0,
                  row_len=0, composed_tasks=0, microbatch_rows=0)
        _check(0.0 <= self.composed_multi_turn <= 1.0,
               f"stages.warm_start.composed_multi_turn must be in [0, 1], got {self.composed_multi_turn}")
        _check(self.row_len <= self.max_seq_len,
               f"stages.warm_start.row_len must be <= max_seq_len ({self.max_seq_len}), got {self.row_len}")
        _positive(self, "stages.warm_start", "time_budget_s")


@dataclasses.dataclass
class PPOStageSpec:
    """Stages 1 and 4: PPO with actors producing episodes (single-turn or multi-turn)."""

    enabled: bool = True
    updates: int = 4
    """PPO updates to run."""
    episodes_per_update: int = 8
    """Trajectories per update (learner.batch_trajectories for this stage)."""
    max_turns: int = 1
    """Agent turns per episode (1 for single-turn)."""
    max_new_tokens_per_turn: int = 2048
    max_context_tokens: int = 8192
    temperature: float = 1.0
    lr: float = 1e-5
    critic_lr: float = 1e-4
    time_budget_s: float = 600.0

    def __post_init__(self) -> None:
        where = "stages.<single_turn_ppo|multi_turn_ppo>"
        _at_least(self, where, updates=0, episodes_per_update=1, max_turns=1, max_new_tokens_per_turn=1,
                  max_context_tokens=2, temperature=0, lr=0, critic_lr=0)
        _positive(self, where, "time_budget_s")


@dataclasses.dataclass
class RFTSpec:
    """Stage 2: rejection-sampling fine-tuning on the warm-up's trajectories with reward >= threshold."""

    enabled: bool = True
    reward_threshold: float = 0.0
    """Keep trajectories with final reward >= this (0 = correct; the paper keeps high-reward ones)."""
    max_task_pass_rate: float = 1.0
    """Keep them only from tasks where at most this fraction (0..1) of the stage's samples reached the threshold
    (1 = every task; 0.75 with groups of 4 leaves out the tasks all 4 samples solved: learner.stages.rft_select)."""
    steps: int = 40
    """Optimiser steps (each `batch_rows` packed rows), at most `max_epochs` passes over the kept data."""
    batch_rows: int = 8
    lr: float = 1e-3
    max_epochs: float = 0.0
    """At most this many passes over the kept trajectories (0 = no limit): a handful of kept trajectories should
    not be trained on for dozens of epochs."""
    time_budget_s: float = 300.0
    repair_per_task: int = 0
    """Also train on up to this many two-turn repair sequences a task (0 = none): a failed sample of the warm-up,
    the refusal actor.agent.verify_on_finish gives with its real verify observation, then a correct sample of the
    same task (cuda_agent.stage_worker.repair_sequences), the loss on the repair turn only. What they teach, a
    second try after a refused finish, shows in multi-turn episodes with verify_on_finish on. One seed of the local
    preset with it lowered the held-out pass rate in the agent loop (benchmarks/RESULTS.md, session 29)."""
    repair_max_tokens: int = 0
    """Longest repair sequence kept, tokens (two replies and an observation); 0 = learner.max_seq_len."""

    def __post_init__(self) -> None:
        _at_least(self, "stages.rft", steps=0, batch_rows=1, lr=0, max_epochs=0, max_task_pass_rate=0,
                  repair_per_task=0, repair_max_tokens=0)
        if self.max_task_pass_rate > 1:
            raise ValueError(f"stages.rft.max_task_pass_rate must be in [0, 1], got {self.max_task_pass_rate}")
        _positive(self, "stages.rft", "time_budget_s")


@dataclasses.dataclass
class ValuePretrainSpec:
    """Stage 3: value pre-training of the critic on the kept trajectories' returns."""

    enabled: bool = True
    steps: int = 40
    batch_rows: int = 8
    lr: float = 1e-3
    time_budget_s: float = 300.0

    def __post_init__(self) -> None:
        _at_least(self, "stages.value_pretrain", steps=0, batch_rows=1, lr=0)
        _positive(self, "stages.value_pretrain", "time_budget_s")


@dataclasses.dataclass
class StagesSpec:
    warm_start: WarmStartSpec = dataclasses.field(default_factory=WarmStartSpec)
    single_turn_ppo: PPOStageSpec = dataclasses.field(default_factory=PPOStageSpec)
    rft: RFTSpec = dataclasses.field(default_factory=RFTSpec)
    value_pretrain: ValuePretrainSpec = dataclasses.field(default_factory=ValuePretrainSpec)
    multi_turn_ppo: PPOStageSpec = dataclasses.field(default_factory=lambda: PPOStageSpec(max_turns=3))


@dataclasses.dataclass
class EvalSpec:
    """Evaluation on the fixed eval split: after stage 0, after each later stage, and every N PPO updates."""

    every_updates: int = 0
    """Also evaluate every N PPO updates inside stages 1 and 4 (0 = only at stage ends)."""
    initial: bool = False
    """Also evaluate the initial policy before stage 0 (a from-scratch model scores -1 everywhere)."""
    after_stages: bool = True
    """Evaluate after stage 0 and after each later stage that changes the policy."""
    samples_per_task: int = 1
    """Episodes per evaluation task (more than 1 with temperature > 0 gives a sampled pass rate)."""
    mode: str = "single_turn"
    """How evaluation episodes run: "single_turn" (one reply holds the solution) or "multi_turn"."""
    max_turns: int = 3
    """Turns of multi-turn evaluation episodes."""
    temperature: float = 0.0
    """0 = greedy decoding."""
    max_new_tokens_per_turn: int = 2048
    max_context_tokens: int = 8192
    on_train_tasks: int = 0
    """Also evaluate on this many training tasks (learning on seen tasks, next to the held-out split)."""
    on_rollout_tasks: bool = False
    """Also evaluate on the PPO stages' rollout tasks (the run's tasks/rollout.jsonl) after each stage: what the RL
    stages learn on the tasks they sample. With tasks.rollout_composed these have no demonstrations, so a gain
    there is the reward's doing, not the warm start's; the held-out split shows whether it carries over."""
    timeout_s: float = 900.0

    def __post_init__(self) -> None:
        _at_least(self, "eval", every_updates=0, samples_per_task=1, max_turns=1, temperature=0,
                  max_new_tokens_per_turn=1, max_context_tokens=2, on_train_tasks=0)
        _positive(self, "eval", "timeout_s")
        _check(self.mode in EVAL_MODES, f"eval.mode must be one of {EVAL_MODES}, got {self.mode!r}")


@dataclasses.dataclass
class SupervisionSpec:
    """Restarts and shutdown of the child processes (cuda_agent.supervisor)."""

    max_restarts: int = 5
    backoff_s: float = 1.0
    stop_timeout_s: float = 60.0
    """Grace after SIGTERM (the learner writes its checkpoint in it) before SIGKILL."""
    ready_timeout_s: float = 600.0
    """How long a child may take to come up (the sandbox node's workers, JAX compilation)."""


@dataclasses.dataclass
class ReportSpec:
    top_kernels: int = 5
    """Final kernels of this many highest-reward episodes go into the report."""
    trajectories_per_stage: int = 2
    """Sampled trajectories rendered for reading, per stage."""


@dataclasses.dataclass
class TrainConfig:
    """One `cuda-agent train` run (see the module doc)."""

    run_dir: str = ""
    """Run folder; "" = runs/<date>-<time>-<preset>."""
    preset: str = "local"
    """Name of the preset the config came from (informational; set by the command)."""
    seed: int = 0
    device: str = "auto"
    """"cpu", "cuda", or "auto" (cuda when torch sees a GPU): picks the sandbox backend, solution format and
    task splits."""
    actors: int = 1
    """Actor processes."""
    cache_dir: str = ""
    """Caches shared across runs (torch.compile baselines, builds); "" = ~/.cache/cuda-agent."""
    prewarm_baselines: bool = True
    """While the model is prepared and the warm start trains, compile the torch.compile baselines of the evaluation
    split, the training probe and the rollout tasks into the sandbox node's inductor cache (`sandbox.prewarm`, at
    nice 10), so that the first evaluation and the first rollouts do not pay them. CPU backend only."""
    jax_memory_fraction: Optional[float] = None
    """Share of the GPU's memory each JAX process of the driver's (learner, evaluation) may take, so that the
    actors (actor.sampler_memory_fraction) and the sandbox node can share one GPU; None = JAX's default."""
    model: ModelSpec = dataclasses.field(default_factory=ModelSpec)
    tokenizer: TokenizerSpec = dataclasses.field(default_factory=TokenizerSpec)
    tasks: TaskSpec = dataclasses.field(default_factory=TaskSpec)
    stages: StagesSpec = dataclasses.field(default_factory=StagesSpec)
    eval: EvalSpec = dataclasses.field(default_factory=EvalSpec)
    learner: LearnerConfig = dataclasses.field(default_factory=LearnerConfig)
    actor: ActorConfig = dataclasses.field(default_factory=ActorConfig)
    node: ServiceConfig = dataclasses.field(default_factory=ServiceConfig)
    supervision: SupervisionSpec = dataclasses.field(default_factory=SupervisionSpec)
    report: ReportSpec = dataclasses.field(default_factory=ReportSpec)

    def episodes_per_actor(self, spec: PPOStageSpec) -> int:
        """Each actor's share of one PPO update's episodes in stage `spec`: actor.episodes_per_version when set
        (0 = no share), else episodes_per_update over the actors, rounded up."""
        if self.actor.episodes_per_version is not None:
            return self.actor.episodes_per_version
        return -(-spec.episodes_per_update // self.actors)

    def __post_init__(self) -> None:
        _check(self.device in DEVICES, f"device must be one of {DEVICES}, got {self.device!r}")
        _check(self.actors >= 1, f"actors must be >= 1, got {self.actors}")
        _check(self.learner.ppo.baseline != "group" or self.actor.group_size >= 2,
               f"learner.ppo.baseline=group compares episodes of one task: it needs actor.group_size >= 2, got "
               f"{self.actor.group_size}")
        if self.learner.ppo.baseline == "group":
            for name in ("single_turn_ppo", "multi_turn_ppo"):
                spec = getattr(self.stages, name)
                share = self.episodes_per_actor(spec)
                _check(not spec.enabled or share % self.actor.group_size == 0,
                       f"stages.{name}.episodes_per_update ({spec.episodes_per_update}) over {self.actors} actor(s) "
                       f"is {share} an actor, not a multiple of actor.group_size ({self.actor.group_size}): groups "
                       "would be split across updates")
        _check(self.jax_memory_fraction is None or 0 < self.jax_memory_fraction <= 1,
               f"jax_memory_fraction must be in (0, 1] or null, got {self.jax_memory_fraction}")
