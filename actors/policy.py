"""Policies: plain classes with one method, `generate(prompts, settings) -> completions`.

    prompts:  a batch of token-id prompts (each the episode's whole context, ending with the generation prompt)
    settings: one `actors.sampler.SamplingParams` per prompt (temperature, top-p/k, max new tokens, stops)
    returns:  one `actors.sampler.Completion` per prompt: sampled ids as generated (stop token included),
              behaviour log-probs `[n]` float32, finish reason ("stop_token" | "stop_string" | "length");
              or, for a prompt that failed on its own, the exception (only that episode ends policy_error).
              Raising fails every episode of the batch.

Each policy has a `version` (the weights version recorded in trajectories; -1 for external policies) and a
`name`. Implementations: `JaxPolicy` here (the KV-cache sampler on one weights version), `OpenAIPolicy` in
`actors.openai_policy` (an external chat-completions endpoint, for evaluation), and a scripted policy in the
tests (a test double).
"""

from __future__ import annotations

import contextlib
import itertools
import time
from typing import Any, Iterator, Protocol, Sequence

from actors.sampler import Completion, NonFiniteLogprobs, Sampler, SamplingParams


class Policy(Protocol):
    version: int
    name: str

    def generate(self, prompts: Sequence[Sequence[int]], settings: Sequence[SamplingParams]) -> list[Completion]:
        ...


class JaxPolicy:
    """The policy on one weights version: `sampler` holds that version's parameters (actors.sampler.Sampler).

    Each call draws a fresh sampling seed from `seed` onwards, so repeated prompts get different samples.
    """

    def __init__(self, sampler: Sampler, version: int, seed: int = 0, name: str = "jax", timing_lock: Any = None):
        self.sampler = sampler
        self.version = int(version)
        self.name = name
        self.timing_lock = timing_lock
        self.lock_waits = 0  # sampler steps that found a timer holding or wanting the GPU
        self.lock_wait_s = 0.0  # seconds those steps waited for it (inside the call's time, not sampling)
        self._seeds = itertools.count((int(seed) * 1_000_003 + self.version * 7919) % (1 << 30))

    def generate(self, prompts: Sequence[Sequence[int]], settings: Sequence[SamplingParams]) -> list[Completion]:
        """One sampler call; with a timing lock, each of its device steps (the prefill, each decode chunk) runs
        under the lock held shared, so that a sandbox worker timing a kernel on the same GPU has the device to
        itself: a step waits while a timer holds or wants it, and the timer waits for one step at most."""
        seed = next(self._seeds) % (1 << 31)
        try:
            return self.sampler.generate([list(p) for p in prompts], list(settings), seed=seed,
                                         gpu_step=None if self.timing_lock is None else self._gpu_step)
        except NonFiniteLogprobs as e:  # only the rows at fault end policy_error
            out: list = list(e.completions)
            for i in e.rows:
                out[i] = FloatingPointError(f"{e} (this prompt's completion)")
            return out

    @contextlib.contextmanager
    def _gpu_step(self) -> Iterator[None]:
        if self.timing_lock.timing_requested():
            self.lock_waits += 1
        t0 = time.monotonic()
        with self.timing_lock.shared():
            self.lock_wait_s += time.monotonic() - t0
            yield


def sampler_timing_lock(mode: str = "auto", lock_dir: str | None = None) -> Any:
    """The GPU timing lock the sampler honours (`sandbox.service_lock.DeviceTimingLock`), or None.

    mode: "on", "off", or "auto" (on when JAX runs on a GPU). The device is the first entry of
    CUDA_VISIBLE_DEVICES (else GPU 0), named as the sandbox node names it, so both take the same lock.
    Granularity: one sampler step, a prefill or a decode chunk (a timer waits at most one step, or its timeout,
    then times anyway and flags `contended`).
    """
    if mode not in ("auto", "on", "off"):
        raise ValueError(f"timing lock mode must be auto, on or off, got {mode!r}")
    if mode == "off":
        return None
    if mode == "auto":
        import jax

        if jax.default_backend() != "gpu":
            return None
    from sandbox.service_lock import DEFAULT_LOCK_DIR, DeviceTimingLock, visible_gpu_key

    return DeviceTimingLock(visible_gpu_key(0), lock_dir or DEFAULT_LOCK_DIR)


def jax_policy_from_update(update, model_config, sampler_config, detokenize=None, seed: int = 0,
                           timing_lock: Any = None) -> JaxPolicy:
    """A JaxPolicy on a weights version fetched from the learner (`protocol.weights_channel.WeightsUpdate`).

    The compiled sampler functions are shared between versions (same shapes), so a new version costs a parameter
    copy to the device, not a recompilation. Raises ValueError when the tensors do not fit `model_config`.
    """
    from actors.weights import model_from_tensors

    model = model_from_tensors(model_config, update.tensors)
    return JaxPolicy(Sampler(model, sampler_config, detokenize=detokenize), update.version, seed=seed,
                     timing_lock=timing_lock)


def jax_policy_from_checkpoint(path, sampler_config, detokenize=None, seed: int = 0, timing_lock: Any = None,
                               **config_overrides) -> JaxPolicy:
    """A frozen JaxPolicy from a Hugging Face checkpoint folder (evaluation mode); version 0, named by the path.
    Raises learner.hf_checkpoint.CheckpointError naming a missing or mismatched file."""
    from learner.hf_checkpoint import load_pretrained

    model = load_pretrained(path, **config_overrides)
    return JaxPolicy(Sampler(model, sampler_config, detokenize=detokenize), 0, seed=seed, name=f"checkpoint:{path}",
                     timing_lock=timing_lock)
