"""Policy sampling in JAX with a KV cache: prefill + decode, jitted with length buckets.

Flow of `Sampler.generate(prompts, params)`:
1. The batch is padded to a power of two, prompts right-padded to a prompt-length bucket P; one jitted
   prefill over `[B, P]` (the model's own attention implementation, padding by lengths) returns each
   layer's keys/values and the logits at each prompt's last token.
2. A jitted start step copies the keys/values into a cache `[B, K, S, Dh]` per layer (S: a cache-length
   bucket >= prompt + max-new-tokens) and samples the first token.
3. Jitted decode chunks (`decode_chunk_steps` steps in a `fori_loop`) feed each row's last token at its own
   position (ragged batches), write its keys/values at that position, attend over the row's valid cache
   prefix, and sample. Rows stop on a stop token or their own max-new-tokens on device; stop strings are
   checked on the host between chunks.
Buckets are powers of two and 1.5x powers of two (64, 96, 128, 192, ...), so a new length recompiles only
when it crosses a bucket; nothing recompiles per length inside a bucket. What is compiled, per model config:
`_prefill` per (batch bucket B, prompt bucket P), `_start` per (B, P, cache length S), `_decode_chunk` per (B, S).
With `SamplerConfig.cache_headroom` at least every request's max-new-tokens (the actor sets it to the agent's
per-turn limit), S is a function of P alone (`Sampler.shape_key`), so a context that grows through n prompt
buckets compiles at most n shapes of each function per batch bucket, whatever the prompt lengths and
max-new-tokens inside them. `shape_keys_seen()` lists the shape keys this process has run (each one compiled
once); `Sampler.precompile` runs chosen shapes ahead (e.g. before an actor's first episode).

Sampling: temperature (0 = greedy), then top-k, then top-p (`learner.model.truncate_logits`), then a
categorical draw. Behaviour log-probs are those of the distribution actually sampled from: log softmax of the
tempered logits, truncated by top-k / top-p and renormalised over the kept tokens when truncation is on (for
greedy rows, at temperature 1). They equal `learner.model.token_logprobs(logits, tokens, temperature, top_k,
top_p)` of the learner's full forward; with top_k=0 and top_p=1 (the usual RL setting) that is the plain
tempered softmax the learner computes with `token_logprobs(logits, tokens, temperature)`.

Parameters are held unstacked (one buffer per layer and weight, cast once to the compute dtype) and the layers
are unrolled in the jitted functions, so each decode step reads every weight once, in place.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import time
from functools import partial
from typing import Any, Callable, ContextManager, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from learner.model import (ModelConfig, Transformer, attend, layer_out, layer_qkv, rms_norm, rope_cos_sin,
                           truncate_logits)

FINISH_STOP_TOKEN = "stop_token"
FINISH_STOP_STRING = "stop_string"
FINISH_LENGTH = "length"


def configure_device_memory(fraction: float | None = None, preallocate: bool | None = None) -> None:
    """Set how much accelerator memory JAX takes, so a learner, a sampler and a sandbox can share one GPU.

    fraction: share of the GPU's memory JAX preallocates (XLA_PYTHON_CLIENT_MEM_FRACTION; JAX's default is
    0.75). preallocate=False: allocate on demand instead (XLA_PYTHON_CLIENT_PREALLOCATE=false).
    Must run before JAX initialises its backends (the first computation). Raises RuntimeError after that.
    """
    try:
        from jax._src.xla_bridge import backends_are_initialized
    except ImportError:  # pragma: no cover - a JAX without it: trust the caller
        backends_are_initialized = lambda: False  # noqa: E731
    if backends_are_initialized():
        raise RuntimeError("configure_device_memory must run before the first JAX computation")
    if fraction is not None:
        if not 0.0 < fraction <= 1.0:
            raise ValueError(f"memory fraction must be in (0, 1], got {fraction}")
        os.environ["XLA_PYTHON_CLIENT_MEM_FRACTION"] = f"{fraction:.3f}"
    if preallocate is not None:
        os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "true" if preallocate else "false"


@dataclasses.dataclass
class SamplerConfig:
    """Buckets and chunking of the sampler."""

    min_prompt_bucket: int = 64
    """Smallest prompt-length bucket (tokens)."""
    min_cache_bucket: int = 128
    """Smallest KV-cache-length bucket (tokens)."""
    max_cache_len: int = 131072
    """Longest prompt + generation accepted (tokens)."""
    decode_chunk_steps: int = 16
    """Decode steps per jitted call; stop strings are checked between calls."""
    min_batch_bucket: int = 1
    """Smallest batch bucket (batches are padded to a power of two at least this)."""
    memory_fraction: Optional[float] = None
    """If set, the actor process passes it to `configure_device_memory` before JAX starts."""
    cache_headroom: int = 0
    """Generation room (tokens) the KV cache always has beyond the prompt bucket: S = bucket(P + max(headroom,
    longest max-new-tokens of the batch)). At least the usual max-new-tokens, S depends on the prompt bucket
    only (one cache shape per prompt bucket instead of one per length mix); 0 = S fits the exact lengths."""

    def __post_init__(self) -> None:
        if self.cache_headroom < 0:
            raise ValueError(f"SamplerConfig.cache_headroom must be >= 0, got {self.cache_headroom}")
        for name in ("min_prompt_bucket", "min_cache_bucket", "max_cache_len", "decode_chunk_steps",
                     "min_batch_bucket"):
            if getattr(self, name) <= 0:
                raise ValueError(f"SamplerConfig.{name} must be > 0, got {getattr(self, name)}")
        if self.memory_fraction is not None and not 0 < self.memory_fraction <= 1:
            raise ValueError(f"SamplerConfig.memory_fraction must be in (0, 1], got {self.memory_fraction}")


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """Per-sequence sampling settings."""

    temperature: float = 1.0
    """> 0; 0 means greedy."""
    top_p: float = 1.0
    """Nucleus mass in (0, 1]; 1 keeps all tokens."""
    top_k: int = 0
    """Keep the k most likely tokens; 0 keeps all."""
    max_new_tokens: int = 256
    """Generation limit for this sequence (>= 1)."""
    stop_token_ids: tuple[int, ...] = ()
    """Generation ends after sampling one of these (the token is kept in the output)."""
    stop_strings: tuple[str, ...] = ()
    """Generation ends at the first token whose decoded text completes one of these (token kept)."""

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")


@dataclasses.dataclass
class Completion:
    """One generated continuation. tokens: the sampled ids exactly as generated (stop token included);
    logprobs `[n]` float32: behaviour log-probs of those ids; finish_reason: "stop_token" | "stop_string" |
    "length"."""

    tokens: list[int]
    logprobs: np.ndarray
    finish_reason: str


def length_bucket(n: int, minimum: int) -> int:
    """Smallest of {2^k, 1.5 * 2^k} that is >= max(n, minimum)."""
    n = max(int(n), int(minimum), 1)
    p = 1 << max(0, (n - 1).bit_length() - 1)  # largest power of two < n (or 1)
    for cand in (p, p + p // 2, 2 * p):
        if cand >= n and cand >= 1:
            return cand
    return 2 * p


def batch_bucket(n: int) -> int:
    """Batch padded to a power of two."""
    return 1 << max(0, (int(n) - 1).bit_length())


# ------------------------------------------------------------------------------ jitted pure functions


_SHAPES_SEEN: set = set()  # (model config, shape key)


def shape_keys_seen(config: ModelConfig | None = None) -> set:
    """Shape keys ("prefill", B, P) / ("start", B, P, S, n_stop, truncate) / ("decode", B, S, n_stop, truncate)
    that samplers of this process have run for `config` (None: any config); each was compiled once."""
    return {k for c, k in _SHAPES_SEEN if config is None or c == config}


@partial(jax.jit, static_argnames=("config",))
def _split_params(stacked: dict, embed: jax.Array, final_norm: jax.Array, head: Any, *, config: ModelConfig) -> dict:
    # Module level, so that every Sampler and every weights version of one config share one compilation (a jit
    # made inside sampler_params compiled again for each new Sampler, i.e. for each weights version).
    dt = config.jnp_dtype
    layers = [{k: v[i].astype(dt) for k, v in stacked.items()} for i in range(config.num_layers)]
    return {"embed": embed.astype(dt), "final_norm": final_norm.astype(dt),
            "head": None if head is None else head.astype(dt), "layers": layers}


def sampler_params(model: Transformer) -> dict:
    """The model's weights for sampling: per-layer buffers (unstacked), cast to the compute dtype.

    Returns {"embed": [V, D], "final_norm": [D], "head": [V, D] or None when tied, "layers": [dict] * L}.
    Compiled once per model config (not per call: a new weights version costs the copy only).
    """
    config = model.config
    head = None if config.tie_embeddings else model.lm_head[...]
    return _split_params(model.backbone.layers.layer_params(), model.backbone.embed[...],
                         model.backbone.final_norm[...], head, config=config)


def _head(params: dict) -> jax.Array:
    return params["embed"] if params["head"] is None else params["head"]


@partial(jax.jit, static_argnames=("config",))
def _prefill(params: dict, tokens: jax.Array, lengths: jax.Array, *, config: ModelConfig):
    """tokens `[B, P]` right-padded, lengths `[B]` -> (per-layer (k, v) `[B, K, P, Dh]`, last logits `[B, V]`)."""
    b, p = tokens.shape
    positions = jnp.broadcast_to(jnp.arange(p, dtype=jnp.int32)[None, :], (b, p))
    x = jnp.take(params["embed"], tokens, axis=0).astype(config.residual_dtype)
    cos, sin = rope_cos_sin(config, positions)
    kv = []
    for layer in params["layers"]:
        q, k, v = layer_qkv(config, layer, x, cos, sin)
        x = layer_out(config, layer, x, attend(config, q, k, v, None, lengths))
        kv.append((k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)))
    last = x[jnp.arange(b), lengths - 1]
    h = rms_norm(last, params["final_norm"], config.rms_norm_eps, config.jnp_dtype)
    logits = jnp.einsum("bd,vd->bv", h, _head(params), preferred_element_type=jnp.float32)
    return kv, logits


class NonFiniteLogprobs(FloatingPointError):
    """Raised by `Sampler.generate` when some completions have a non-finite behaviour log-prob.

    rows: the prompt indices at fault; completions: every prompt's completion, in prompt order (the others are
    usable); prompt_tokens: the faulty prompts' lengths.
    """

    def __init__(self, rows: list[int], completions: list, prompt_tokens: list[int]):
        self.rows, self.completions = rows, completions
        super().__init__(f"sampler: non-finite behaviour log-probs in {len(rows)} of {len(completions)} completions "
                         f"(first: prompt {rows[0]} of {prompt_tokens[0]} tokens): the model's logits are NaN or inf")


def _sample(logits: jax.Array, sampling: dict, key: jax.Array, truncate: bool):
    """logits `[B, V]` float32 -> (tokens `[B]` int32, behaviour log-probs `[B]` float32)."""
    temperature = sampling["temperature"]
    greedy = temperature <= 0
    t = jnp.where(greedy, 1.0, temperature)
    x = logits / t[:, None]
    if truncate:
        x = truncate_logits(x, sampling["top_k"], sampling["top_p"])
    drawn = jax.random.categorical(key, x, axis=-1).astype(jnp.int32)
    tokens = jnp.where(greedy, jnp.argmax(x, axis=-1).astype(jnp.int32), drawn)
    # == token_logprobs(logits, tokens, t, top_k, top_p): x is already tempered and truncated.
    picked = jnp.take_along_axis(x, tokens[:, None], axis=-1)[:, 0]
    return tokens, picked - jax.nn.logsumexp(x, axis=-1)


def _is_stop(tokens: jax.Array, stop_ids: jax.Array) -> jax.Array:
    return jnp.any(tokens[:, None] == stop_ids, axis=-1)


@partial(jax.jit, static_argnames=("cache_len", "out_len", "truncate"))
def _start(kv: list, logits: jax.Array, lengths: jax.Array, sampling: dict, key: jax.Array, *, cache_len: int,
           out_len: int, truncate: bool) -> dict:
    """Build the decode state: caches `[B, K, S, Dh]` holding the prompt, and the first sampled token."""
    b = logits.shape[0]
    caches = []
    for k, v in kv:
        shape = (k.shape[0], k.shape[1], cache_len, k.shape[3])
        caches.append((jax.lax.dynamic_update_slice(jnp.zeros(shape, k.dtype), k, (0, 0, 0, 0)),
                       jax.lax.dynamic_update_slice(jnp.zeros(shape, v.dtype), v, (0, 0, 0, 0))))
    key, sub = jax.random.split(key)
    tok, lp = _sample(logits, sampling, sub, truncate)
    active = sampling["active"]
    done = ~active | _is_stop(tok, sampling["stop_ids"]) | (sampling["max_new"] <= 1)
    return {
        "caches": caches, "lengths": lengths.astype(jnp.int32), "last": tok, "done": done,
        "n_gen": active.astype(jnp.int32),
        "out_tokens": jnp.zeros((b, out_len), jnp.int32).at[:, 0].set(tok),
        "out_logprobs": jnp.zeros((b, out_len), jnp.float32).at[:, 0].set(lp),
        "key": key,
    }


def _decode_attend(q: jax.Array, ck: jax.Array, cv: jax.Array, valid: jax.Array) -> jax.Array:
    """q `[B, 1, H, Dh]` against caches `[B, K, S, Dh]`; keys at index < valid[b] count. -> `[B, 1, H, Dh]`."""
    b, _, h, dh = q.shape
    kh, s = ck.shape[1], ck.shape[2]
    qg = q.reshape(b, kh, h // kh, dh)
    scores = jnp.einsum("bkgd,bksd->bkgs", qg, ck, preferred_element_type=jnp.float32) / math.sqrt(dh)
    mask = jnp.arange(s)[None, :] < valid[:, None]
    scores = jnp.where(mask[:, None, None, :], scores, -1e30)
    probs = jax.nn.softmax(scores, axis=-1).astype(cv.dtype)
    return jnp.einsum("bkgs,bksd->bkgd", probs, cv).reshape(b, 1, h, dh)


@partial(jax.jit, static_argnames=("config", "steps", "truncate"), donate_argnames=("state",))
def _decode_chunk(params: dict, state: dict, sampling: dict, *, config: ModelConfig, steps: int,
                  truncate: bool) -> dict:
    """`steps` decode steps for every row that is not done."""
    head = _head(params)

    def step(_, s):
        b = s["last"].shape[0]
        rows = jnp.arange(b)
        active = ~s["done"]
        pos = s["lengths"]
        x = jnp.take(params["embed"], s["last"], axis=0)[:, None, :].astype(config.residual_dtype)
        cos, sin = rope_cos_sin(config, pos[:, None])
        caches = []
        for layer, (ck, cv) in zip(params["layers"], s["caches"]):
            q, k, v = layer_qkv(config, layer, x, cos, sin)
            write = jnp.minimum(pos, ck.shape[2] - 1)
            ck = ck.at[rows, :, write].set(k[:, 0])
            cv = cv.at[rows, :, write].set(v[:, 0])
            x = layer_out(config, layer, x, _decode_attend(q, ck, cv, pos + 1))
            caches.append((ck, cv))
        h = rms_norm(x[:, 0], params["final_norm"], config.rms_norm_eps, config.jnp_dtype)
        logits = jnp.einsum("bd,vd->bv", h, head, preferred_element_type=jnp.float32)
        key, sub = jax.random.split(s["key"])
        tok, lp = _sample(logits, sampling, sub, truncate)
        n = s["n_gen"]
        slot = jnp.minimum(n, s["out_tokens"].shape[1] - 1)
        out_tokens = s["out_tokens"].at[rows, slot].set(jnp.where(active, tok, s["out_tokens"][rows, slot]))
        out_lp = s["out_logprobs"].at[rows, slot].set(jnp.where(active, lp, s["out_logprobs"][rows, slot]))
        n_new = n + active.astype(jnp.int32)
        done = s["done"] | (active & (_is_stop(tok, sampling["stop_ids"]) | (n_new >= sampling["max_new"])))
        return {"caches": caches, "lengths": pos + active.astype(jnp.int32), "last": jnp.where(active, tok, s["last"]),
                "done": done, "n_gen": n_new, "out_tokens": out_tokens, "out_logprobs": out_lp, "key": key}

    return jax.lax.fori_loop(0, steps, step, state)


@partial(jax.jit, donate_argnames=("state",))
def _mark_done(state: dict, rows: jax.Array) -> dict:
    return {**state, "done": state["done"] | rows}


# ------------------------------------------------------------------------------------------- sampler


class Sampler:
    """Generates continuations of token prompts with the policy's current weights.

    model: the policy (its config picks dtype and attention implementation for the prefill).
    detokenize: ids -> text, needed only for stop strings (e.g. `learner.tokenizer.Tokenizer.decode`).
    """

    def __init__(self, model: Transformer, config: SamplerConfig | None = None,
                 detokenize: Callable[[Sequence[int]], str] | None = None):
        self.config = config or SamplerConfig()
        self.model_config: ModelConfig = model.config
        self.detokenize = detokenize
        self.params = sampler_params(model)
        self.last_stats: dict[str, Any] = {}

    def set_weights(self, model: Transformer) -> None:
        """Swap in new weights (same config), e.g. a new policy version between episodes."""
        if model.config != self.model_config:
            raise ValueError("set_weights: the new model's config differs from the sampler's")
        self.params = None  # drop the old buffers first
        self.params = sampler_params(model)

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams | Sequence[SamplingParams] = SamplingParams(),
                 seed: int = 0, gpu_step: Callable[[], ContextManager[Any]] | None = None) -> list[Completion]:
        """Sample one continuation per prompt. prompts: token ids (each non-empty, ids in [0, V)).

        params: one SamplingParams for all, or one per prompt. Returns completions in prompt order.
        gpu_step: a context manager factory entered around each unit of device work (the prefill, each decode
        chunk), which returns only once that work is done on the device: a GPU shared with a sandbox's timing
        (actors.policy.JaxPolicy passes the timing lock's shared section) waits at most one step.
        Raises ValueError for an empty prompt, an id out of range, or prompt + max_new_tokens over
        `max_cache_len`; stop strings without a `detokenize` function. Raises NonFiniteLogprobs (a
        FloatingPointError) when a sampled token's behaviour log-prob is not finite (NaN / inf logits: the tokens
        drawn from them mean nothing); it carries the rows at fault and every row's completion.
        """
        n = len(prompts)
        if n == 0:
            return []
        per = list(params) if isinstance(params, (list, tuple)) else [params] * n
        if len(per) != n:
            raise ValueError(f"{len(per)} SamplingParams for {n} prompts")
        lens = [len(p) for p in prompts]
        vocab = self.model_config.vocab_size
        for i, p in enumerate(prompts):
            if not p:
                raise ValueError(f"prompt {i} is empty")
            if min(p) < 0 or max(p) >= vocab:
                raise ValueError(f"prompt {i} has token ids outside [0, {vocab})")
            if len(p) + per[i].max_new_tokens > self.config.max_cache_len:
                raise ValueError(f"prompt {i}: {len(p)} tokens + max_new_tokens {per[i].max_new_tokens} exceeds "
                                 f"max_cache_len {self.config.max_cache_len}")
        if any(sp.stop_strings for sp in per) and self.detokenize is None:
            raise ValueError("stop strings need a detokenize function (Sampler(..., detokenize=tokenizer.decode))")

        cfg = self.config
        b, p_len, cache_len = self.shape_key(n, max(lens), max(l + sp.max_new_tokens for l, sp in zip(lens, per)),
                                             max(sp.max_new_tokens for sp in per))
        out_len = cache_len  # >= every max_new_tokens; one shape key fewer to compile for
        tokens = np.zeros((b, p_len), np.int32)
        lengths = np.ones((b,), np.int32)
        for i, p in enumerate(prompts):
            tokens[i, :len(p)] = p
            lengths[i] = len(p)
        n_stop = max(1, max(len(sp.stop_token_ids) for sp in per))
        stop_ids = np.full((b, n_stop), -1, np.int32)
        for i, sp in enumerate(per):
            stop_ids[i, :len(sp.stop_token_ids)] = sp.stop_token_ids
        pad = [SamplingParams(max_new_tokens=1)] * (b - n)
        allp = per + pad
        sampling = {
            "temperature": jnp.asarray([sp.temperature for sp in allp], jnp.float32),
            "top_k": jnp.asarray([sp.top_k for sp in allp], jnp.int32),
            "top_p": jnp.asarray([sp.top_p for sp in allp], jnp.float32),
            "max_new": jnp.asarray([sp.max_new_tokens for sp in allp], jnp.int32),
            "stop_ids": jnp.asarray(stop_ids),
            "active": jnp.asarray(np.arange(b) < n),
        }
        truncate = any(sp.top_k > 0 or sp.top_p < 1.0 for sp in per)
        new_shapes = self._note_shapes([("prefill", b, p_len), ("start", b, p_len, cache_len, n_stop, truncate)])

        step = gpu_step or contextlib.nullcontext
        t0 = time.perf_counter()
        with step():
            kv, logits = _prefill(self.params, jnp.asarray(tokens), jnp.asarray(lengths), config=self.model_config)
            state = _start(kv, logits, jnp.asarray(lengths), sampling, jax.random.key(seed), cache_len=cache_len,
                           out_len=out_len, truncate=truncate)
            del kv, logits
            done = np.asarray(state["done"])  # waits for the device
        t1 = time.perf_counter()
        stop_at: dict[int, int] = {}  # row -> number of tokens kept (stop string)
        checked = np.zeros(b, np.int64)
        chunks = 0
        while not done.all():
            if not chunks:
                new_shapes += self._note_shapes([("decode", b, cache_len, n_stop, truncate)])
            with step():
                state = _decode_chunk(self.params, state, sampling, config=self.model_config,
                                      steps=cfg.decode_chunk_steps, truncate=truncate)
                done = np.asarray(state["done"])  # waits for the device
            chunks += 1
            if any(sp.stop_strings for sp in per):
                hits = self._check_stop_strings(state, per, checked, stop_at)
                if hits.any():
                    state = _mark_done(state, jnp.asarray(hits))
                    done = done | hits
        out_tokens, out_lp, n_gen = jax.device_get((state["out_tokens"], state["out_logprobs"], state["n_gen"]))
        t2 = time.perf_counter()
        self.last_stats = {"prefill_s": t1 - t0, "decode_s": t2 - t1, "decode_steps": chunks * cfg.decode_chunk_steps,
                           "batch": b, "prompt_bucket": p_len, "cache_len": cache_len,
                           "generated_tokens": int(n_gen[:n].sum()), "new_shapes": new_shapes}
        del state
        bad = [i for i in range(n) if not np.isfinite(out_lp[i, :int(n_gen[i])]).all()]
        results = []
        for i in range(n):
            count = int(n_gen[i])
            reason = FINISH_LENGTH
            if i in stop_at:
                count, reason = stop_at[i], FINISH_STOP_STRING
            elif count and int(out_tokens[i, count - 1]) in per[i].stop_token_ids:
                reason = FINISH_STOP_TOKEN
            results.append(Completion(out_tokens[i, :count].tolist(), np.asarray(out_lp[i, :count], np.float32),
                                      reason))
        if bad:
            raise NonFiniteLogprobs(bad, results, [lens[i] for i in bad])
        return results

    def shape_key(self, n: int, longest_prompt: int, longest_total: int, longest_new: int) -> tuple[int, int, int]:
        """(batch bucket B, prompt bucket P, cache length S) of a call with `n` prompts, the longest `longest_prompt`
        tokens, the longest prompt + max-new-tokens `longest_total`, the largest max-new-tokens `longest_new`."""
        cfg = self.config
        b = max(batch_bucket(n), batch_bucket(cfg.min_batch_bucket))
        p_len = length_bucket(longest_prompt, cfg.min_prompt_bucket)
        if cfg.cache_headroom:
            need = p_len + max(cfg.cache_headroom, longest_new)  # >= longest_total: P >= every prompt
            cap = length_bucket(cfg.max_cache_len, cfg.min_cache_bucket)  # >= every prompt + max-new-tokens
            cache_len = max(p_len, min(length_bucket(need, cfg.min_cache_bucket), max(cap, longest_total)))
        else:
            cache_len = max(p_len, length_bucket(longest_total, cfg.min_cache_bucket))
        return b, p_len, cache_len

    def _note_shapes(self, keys: list) -> list:
        new = [k for k in keys if (self.model_config, k) not in _SHAPES_SEEN]
        _SHAPES_SEEN.update((self.model_config, k) for k in keys)
        return new

    def precompile(self, batch: int, prompt_lens: Sequence[int], max_new_tokens: int, n_stop: int = 1,
                   on_done: Callable[[tuple[int, int, int], float], None] | None = None) -> list[tuple[int, int, int]]:
        """Compile ahead the shapes that calls of `batch` prompts, the longest of each length in `prompt_lens`,
        with `max_new_tokens` and `n_stop` stop token ids (per row, at most) will take: one short call per
        (B, P, S) on dummy prompts (prefill, start and one decode chunk, 2 tokens sampled, untruncated sampling).
        Returns the keys run; on_done(key, seconds) after each. Uses the device briefly; no timing lock."""
        keys: list[tuple[int, int, int]] = []
        for n_tok in prompt_lens:
            key = self.shape_key(batch, n_tok, n_tok + max_new_tokens, max_new_tokens)
            if key in keys:
                continue
            t0 = time.perf_counter()
            self._run_shape(key, n_tok, max(1, n_stop))
            keys.append(key)
            if on_done is not None:
                on_done(key, time.perf_counter() - t0)
        return keys

    def _run_shape(self, key: tuple[int, int, int], n_tok: int, n_stop: int) -> None:
        b, p_len, cache_len = key
        tokens = np.zeros((b, p_len), np.int32)
        lengths = np.full((b,), max(1, min(n_tok, p_len)), np.int32)
        sampling = {"temperature": jnp.ones((b,), jnp.float32), "top_k": jnp.zeros((b,), jnp.int32),
                    "top_p": jnp.ones((b,), jnp.float32), "max_new": jnp.full((b,), 2, jnp.int32),
                    "stop_ids": jnp.full((b, n_stop), -1, jnp.int32), "active": jnp.ones((b,), bool)}
        self._note_shapes([("prefill", b, p_len), ("start", b, p_len, cache_len, n_stop, False),
                           ("decode", b, cache_len, n_stop, False)])
        kv, logits = _prefill(self.params, jnp.asarray(tokens), jnp.asarray(lengths), config=self.model_config)
        state = _start(kv, logits, jnp.asarray(lengths), sampling, jax.random.key(0), cache_len=cache_len,
                       out_len=cache_len, truncate=False)
        del kv, logits
        state = _decode_chunk(self.params, state, sampling, config=self.model_config,
                              steps=self.config.decode_chunk_steps, truncate=False)
        jax.block_until_ready(state["out_tokens"])

    def _check_stop_strings(self, state: dict, per: list[SamplingParams], checked: np.ndarray,
                            stop_at: dict[int, int]) -> np.ndarray:
        """Rows whose new tokens complete a stop string; records how many tokens each keeps."""
        out_tokens, n_gen = jax.device_get((state["out_tokens"], state["n_gen"]))
        hits = np.zeros(len(checked), bool)
        for i, sp in enumerate(per):
            if not sp.stop_strings or i in stop_at:
                continue
            count = int(n_gen[i])
            if count <= checked[i]:
                continue
            window = max(len(s) for s in sp.stop_strings) * 4 + 8  # tokens that can hold a stop string
            lo = max(0, int(checked[i]) - window)
            row = out_tokens[i, :count].tolist()
            if any(s in self.detokenize(row[lo:count]) for s in sp.stop_strings):
                for j in range(int(checked[i]), count):  # the first token that completes a stop string
                    start = max(0, j + 1 - window)
                    text = self.detokenize(row[start:j + 1])
                    if any(s in text for s in sp.stop_strings):
                        stop_at[i] = j + 1
                        hits[i] = True
                        break
            checked[i] = count
        return hits
