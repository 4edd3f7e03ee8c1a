"""Typed configuration of an actor: the agent loop's limits (`AgentConfig`), the sandbox stages the tools run
(`StagesConfig`), and the actor process (`ActorConfig`). YAML presets and `a.b=value` overrides go through
`cuda_agent.config.load_config(ActorConfig, ...)`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Optional

MODES = ("multi_turn", "single_turn")
REWARD_FROM = ("final", "best")
SOLUTION_FORMATS = ("auto", "cubin", "extension", "cpu")
SKILLS = ("full", "brief")


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


@dataclasses.dataclass
class AgentConfig:
    """One episode of the agent loop (paper: up to 200 turns and 128k tokens of context)."""

    mode: str = "multi_turn"
    """"multi_turn" (ReAct episodes with tools) or "single_turn" (one reply holds the whole solution; stage 1)."""
    max_turns: int = 8
    """Most assistant turns per episode; the workspace is evaluated after the last one."""
    max_context_tokens: int = 32768
    """Most tokens in the episode's context (prompt, turns and observations); past it: `context_exhausted`."""
    max_new_tokens_per_turn: int = 4096
    """Most tokens one assistant turn may sample (a turn cut here is kept, closed with <|im_end|> unsampled)."""
    min_new_tokens_per_turn: int = 64
    """A turn needs at least this much context left; otherwise the episode ends `context_exhausted`."""
    episode_time_s: float = 3600.0
    """Wall-clock budget of an episode, seconds (checked between steps; the final evaluation is extra)."""
    max_tool_calls_per_turn: int = 8
    """Tool calls executed per turn; more are answered "not run"."""
    reward_from: str = "final"
    """"final": the final workspace's milestone reward (the paper); "best": the best of that and every full
    evaluation (`profile`) seen during the episode."""
    temperature: float = 1.0
    """Sampling temperature (the learner applies the same one to its log-probs)."""
    top_p: float = 1.0
    """Nucleus sampling mass (1 = off; see actors.sampler for how truncation enters behaviour log-probs)."""
    top_k: int = 0
    """Top-k sampling (0 = off)."""
    skill: str = "full"
    """System prompt: "full" skill text (workspace, rules, format, tools, goal), or "brief" (about 150 tokens,
    for small models trained from scratch)."""
    solution_format: str = "auto"
    """"cubin", "extension", "cpu", or "auto": the sandbox nodes' backend decides (cuda -> cubin, cpu -> cpu)."""
    observation_max_chars: int = 3000
    """Longest observation text handed back to the model (longer ones are cut with a note)."""
    compile_error_lines: int = 12
    """Compiler output lines kept in a `compile` observation, counted from the first error."""
    read_file_max_chars: int = 12000
    """Longest file text `read_file` returns."""
    verify_on_finish: bool = False
    """Multi-turn: `finish` first verifies the workspace (the `verify` tool's job); when that fails and a turn is
    left, the finish is refused with the verify observation and the episode goes on, so the policy sees why its
    solution fails and may fix it. The reward is still the final evaluation's. Costs one verify job per finish.
    With the local preset's small model no second try passed (benchmarks/RESULTS.md, session 29)."""

    def __post_init__(self) -> None:
        _check(self.mode in MODES, f"AgentConfig.mode must be one of {MODES}, got {self.mode!r}")
        _check(self.reward_from in REWARD_FROM, f"AgentConfig.reward_from must be one of {REWARD_FROM}, "
                                                f"got {self.reward_from!r}")
        _check(self.skill in SKILLS, f"AgentConfig.skill must be one of {SKILLS}, got {self.skill!r}")
        _check(self.solution_format in SOLUTION_FORMATS,
               f"AgentConfig.solution_format must be one of {SOLUTION_FORMATS}, got {self.solution_format!r}")
        for name in ("max_turns", "max_new_tokens_per_turn", "min_new_tokens_per_turn", "max_tool_calls_per_turn",
                     "observation_max_chars", "compile_error_lines", "read_file_max_chars"):
            _check(getattr(self, name) >= 1, f"AgentConfig.{name} must be >= 1, got {getattr(self, name)}")
        _check(self.max_context_tokens >= self.min_new_tokens_per_turn + 1,
               f"AgentConfig.max_context_tokens ({self.max_context_tokens}) must exceed min_new_tokens_per_turn "
               f"({self.min_new_tokens_per_turn})")
        _check(self.episode_time_s > 0, f"AgentConfig.episode_time_s must be > 0, got {self.episode_time_s}")
        _check(self.temperature >= 0, f"AgentConfig.temperature must be >= 0, got {self.temperature}")
        _check(0 < self.top_p <= 1, f"AgentConfig.top_p must be in (0, 1], got {self.top_p}")
        _check(self.top_k >= 0, f"AgentConfig.top_k must be >= 0, got {self.top_k}")


@dataclasses.dataclass
class StagesConfig:
    """How the tools and the final evaluation use the sandbox nodes (`SandboxJob.settings` per stage; the keys
    are the node's `sandbox.service.EVAL_SETTINGS`)."""

    compile_settings: Dict[str, Any] = dataclasses.field(default_factory=lambda: {"build_only": True})
    """`compile` tool: static checks and build only."""
    verify_settings: Dict[str, Any] = dataclasses.field(default_factory=lambda: {"profile": False})
    """`verify` tool: build, load and the correctness trials, no timing."""
    profile_settings: Dict[str, Any] = dataclasses.field(default_factory=dict)
    """`profile` tool: a full evaluation (timing and milestone). Keep it equal to final_settings so that an
    unchanged workspace's final evaluation is answered from the node's result cache."""
    final_settings: Dict[str, Any] = dataclasses.field(default_factory=dict)
    """The final evaluation whose milestone becomes the reward."""
    compile_deadline_s: float = 300.0
    """Give up on a compile job after this long (seconds, over every node and retry)."""
    verify_deadline_s: float = 600.0
    """Give up on a verify job after this long."""
    profile_deadline_s: float = 900.0
    """Give up on a profile or final job after this long."""
    attempts: int = 3
    """Tries per job across nodes (a timed-out try is resent to another node with the same job id)."""
    unavailable_after_s: float = 60.0
    """A job fails as `sandbox_error` once no node has been alive for this long."""
    priority: int = 1
    """Job priority: 1 training rollouts, 0 evaluation (served first)."""

    def __post_init__(self) -> None:
        for name in ("compile_deadline_s", "verify_deadline_s", "profile_deadline_s", "unavailable_after_s"):
            _check(getattr(self, name) > 0, f"StagesConfig.{name} must be > 0, got {getattr(self, name)}")
        _check(self.attempts >= 1, f"StagesConfig.attempts must be >= 1, got {self.attempts}")
        _check(self.priority >= 0, f"StagesConfig.priority must be >= 0, got {self.priority}")


@dataclasses.dataclass
class ActorConfig:
    """One actor process: concurrent episodes, batched sampling, weight refresh, endpoints."""

    actor_id: str = ""
    """Name in trajectories and logs; "" = <hostname>-<pid>."""
    concurrent_episodes: int = 16
    """Episodes in flight at once (their generations are batched; their tool calls overlap sampling)."""
    max_batch: int = 64
    """Most sequences in one sampler call."""
    gather_s: float = 0.02
    """Longest wait for more episodes to join a sampler call once one is waiting (seconds)."""
    weights_poll_s: float = 5.0
    """How often to ask the learner for a newer weights version (seconds)."""
    seed: int = 0
    """Seed of sampling and task order."""
    group_size: int = 1
    """Training episodes per drawn task, in a row: the group the learner's group baseline compares them within
    (`learner.ppo.baseline="group"`, which needs >= 2); 1 = each task once per pass."""
    trajectories_endpoint: str = ""
    """The learner's trajectory receiver, e.g. "tcp://learner:5555" ("" = no learner: evaluation)."""
    weights_endpoint: str = ""
    """The learner's weights publisher, e.g. "tcp://learner:5556"."""
    learner_curve_secret_key: str = ""
    """This actor's CURVE secret key file for the learner's channels ("" = no CURVE; the learner requires it when
    it binds beyond loopback: `cuda-agent learner keys DIR`)."""
    learner_public_key: str = ""
    """The learner's CURVE public key file (`server.key`), with `learner_curve_secret_key`."""
    sandbox_endpoints: str = "tcp://127.0.0.1:5557"
    """Comma-separated sandbox node endpoints."""
    failure_backoff_s: float = 1.0
    """After an episode that ends in policy_error or sandbox_error (or crashes), new episodes start only after this
    wait (seconds), doubled for each further wait in a row up to `failure_backoff_max_s`; failures that end during a
    wait (the rest of the same burst) do not lengthen it, and any other ending resets it. A broken policy or sandbox
    then costs at most `concurrent_episodes` episodes per wait, not thousands a minute (0 = no wait; evaluations
    run without one: `cuda_agent.eval.eval_actor_config`)."""
    failure_backoff_max_s: float = 30.0
    """The longest such wait (seconds)."""
    episodes_per_version: Optional[int] = None
    """Staleness control (AReaL's, Fu et al. 2025, section 5.1): this actor's share of one learner batch. While it
    holds weights version v it has started at most (v - v0 + 1 + versions_ahead) * episodes_per_version episodes
    (v0: the first version it received), then waits for newer weights. A fast actor can then not outrun the
    learner: no pile of trajectories the staleness bound will drop, and on a shared GPU no sampling that takes the
    learner's time for nothing. None = automatic: a PPO stage of `cuda-agent train` sets the actor's share of the
    stage's batch, anywhere else (a standalone actor, evaluations) there is no limit; 0 = no limit, also in a PPO
    stage. In a PPO stage a share (automatic or set) is one batch's: with weights published every K updates the
    stage adds K - 1 to `versions_ahead`."""
    versions_ahead: int = 1
    """How many batches beyond the current version's share an actor may sample ahead of the learner (with
    `episodes_per_version`): 1 lets the next batch be sampled while the learner trains on this one."""
    quota_max_wait_s: float = 300.0
    """Liveness valve of the staleness control: after waiting this long (seconds) for newer weights, the actor
    starts one more share anyway (logged, counted as `quota_overrides`), so a learner that refused some
    trajectories cannot wait forever for a batch the actors will not sample."""
    max_pending_trajectories: int = 1024
    """Trajectories kept until the learner acknowledges them (episodes wait beyond it)."""
    sampler_memory_fraction: Optional[float] = None
    """Share of the accelerator's memory JAX may take (so a sandbox can share the GPU); None = JAX default."""
    timing_lock: str = "auto"
    """Honour the sandbox's per-GPU timing lock around sampler calls: "auto" (on when JAX runs on a GPU), "on",
    "off". A sandbox node timing a kernel on the same GPU then has it to itself."""
    timing_lock_dir: str = ""
    """Folder of the lock files; "" = the sandbox's default (/dev/shm/cuda-agent-locks)."""
    max_cache_len: int = 0
    """Sampler KV-cache bound in tokens; 0 = agent.max_context_tokens."""
    sampler_min_batch_bucket: int = 1
    """Sampler batches are padded to a power of two at least this (fewer shapes to compile)."""
    sampler_min_prompt_bucket: int = 64
    """Smallest prompt-length bucket of the sampler (tokens)."""
    sampler_decode_chunk_steps: int = 16
    """Decode steps per jitted sampler call."""
    model_dtype: str = ""
    """The sampler's compute dtype (learner.model.ModelConfig.dtype: "float32" or "bfloat16"); "" = what the
    checkpoint's config.json gives (float32). `cuda-agent train` sets the run's, the learner's numerics."""
    attention_impl: str = ""
    """The sampler's attention (ModelConfig.attention_impl: "xla", "cudnn" or "chunked"); "" = the checkpoint's
    default, "xla", whose prefill holds [B, H, T, T] float32 scores (XLA's compiled temp for one 0.5B layer, 4 prompts of 8192
    tokens: 42 GiB, read on the CPU box)."""
    agent: AgentConfig = dataclasses.field(default_factory=AgentConfig)
    stages: StagesConfig = dataclasses.field(default_factory=StagesConfig)

    def model_overrides(self) -> dict:
        """ModelConfig fields to set when the policy is loaded (learner.hf_checkpoint.read_config overrides)."""
        return {k: v for k, v in (("dtype", self.model_dtype), ("attention_impl", self.attention_impl)) if v}

    def __post_init__(self) -> None:
        _check(self.model_dtype in ("", "float32", "bfloat16"),
               f"ActorConfig.model_dtype must be '', float32 or bfloat16, got {self.model_dtype!r}")
        _check(self.attention_impl in ("", "xla", "cudnn", "chunked"),
               f"ActorConfig.attention_impl must be '', xla, cudnn or chunked, got {self.attention_impl!r}")
        _check(self.concurrent_episodes >= 1, f"ActorConfig.concurrent_episodes must be >= 1, "
                                              f"got {self.concurrent_episodes}")
        _check(self.max_batch >= 1, f"ActorConfig.max_batch must be >= 1, got {self.max_batch}")
        _check(self.group_size >= 1, f"ActorConfig.group_size must be >= 1, got {self.group_size}")
        _check(self.gather_s >= 0, f"ActorConfig.gather_s must be >= 0, got {self.gather_s}")
        _check(self.weights_poll_s > 0, f"ActorConfig.weights_poll_s must be > 0, got {self.weights_poll_s}")
        _check(self.max_pending_trajectories >= 1, "ActorConfig.max_pending_trajectories must be >= 1")
        _check((self.episodes_per_version is None or self.episodes_per_version >= 0) and self.versions_ahead >= 0,
               f"ActorConfig.episodes_per_version and versions_ahead must be >= 0, got {self.episodes_per_version} "
               f"and {self.versions_ahead}")
        _check(self.quota_max_wait_s > 0, f"ActorConfig.quota_max_wait_s must be > 0, got {self.quota_max_wait_s}")
        _check(0 <= self.failure_backoff_s <= self.failure_backoff_max_s,
               f"ActorConfig.failure_backoff_s must be in [0, failure_backoff_max_s], got {self.failure_backoff_s} "
               f"(max {self.failure_backoff_max_s})")
        _check(self.max_cache_len >= 0, "ActorConfig.max_cache_len must be >= 0")
        _check(bool(self.learner_curve_secret_key) == bool(self.learner_public_key),
               "ActorConfig.learner_curve_secret_key and learner_public_key go together (both or neither)")
        _check(self.timing_lock in ("auto", "on", "off"), f"ActorConfig.timing_lock must be auto, on or off, got "
                                                          f"{self.timing_lock!r}")
        for name in ("sampler_min_batch_bucket", "sampler_min_prompt_bucket", "sampler_decode_chunk_steps"):
            _check(getattr(self, name) >= 1, f"ActorConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.sampler_memory_fraction is not None:
            _check(0 < self.sampler_memory_fraction <= 1, "ActorConfig.sampler_memory_fraction must be in (0, 1]")

    def sampler_config(self):
        """The `actors.sampler.SamplerConfig` these fields describe (imports JAX). The cache leaves room for a whole
        turn (`agent.max_new_tokens_per_turn`) beyond the prompt bucket, so the sampler compiles one cache shape
        per prompt bucket and batch bucket."""
        from actors.sampler import SamplerConfig

        return SamplerConfig(min_prompt_bucket=self.sampler_min_prompt_bucket,
                             min_cache_bucket=2 * self.sampler_min_prompt_bucket,
                             min_batch_bucket=self.sampler_min_batch_bucket,
                             decode_chunk_steps=self.sampler_decode_chunk_steps,
                             max_cache_len=self.max_cache_len or self.agent.max_context_tokens,
                             memory_fraction=self.sampler_memory_fraction,
                             cache_headroom=self.agent.max_new_tokens_per_turn)

    @property
    def sandbox_endpoint_list(self) -> list[str]:
        return [e.strip() for e in self.sandbox_endpoints.split(",") if e.strip()]
