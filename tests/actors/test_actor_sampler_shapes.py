"""The sampler's compiled shapes stay bounded: a context that grows through the prompt buckets, with batches of
every size up to the batch bucket and any max-new-tokens under the cache headroom, compiles each jitted function
once per prompt bucket (counted from JAX's own backend-compile events), and new weights versions compile nothing.
"""

from __future__ import annotations

import collections
import contextlib
import random

import jax.monitoring
import pytest

from actors.sampler import Sampler, SamplerConfig, SamplingParams, length_bucket, shape_keys_seen
from actors.weights import model_from_tensors, random_policy_tensors
from learner.model import ModelConfig

COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


@contextlib.contextmanager
def count_compiles():
    """Counter of real XLA compilations by function name while the block runs."""
    counts: collections.Counter = collections.Counter()

    def on(event, duration, **kw):
        if event == COMPILE_EVENT or "backend_compile" in event:
            name = str(kw.get("fun_name", ""))
            for fn in ("_prefill", "_start", "_decode_chunk", "_split_params"):
                if fn in name:
                    counts[fn] += 1

    jax.monitoring.register_event_duration_secs_listener(on)
    try:
        yield counts
    finally:
        try:
            jax.monitoring.unregister_event_duration_listener(on)
        except (AttributeError, ValueError):  # pragma: no cover - older JAX: leave it registered
            pass


def _model(config, seed):
    return model_from_tensors(config, random_policy_tensors(config, seed=seed))


def test_growing_contexts_compile_once_per_prompt_bucket():
    # A config no other test uses, so the process-wide jit caches start empty for it.
    config = ModelConfig.tiny(vocab_size=97, num_layers=1)
    scfg = SamplerConfig(min_prompt_bucket=16, min_cache_bucket=32, max_cache_len=256, decode_chunk_steps=4,
                         min_batch_bucket=4, cache_headroom=12)
    sampler = Sampler(_model(config, 0), scfg)
    rng = random.Random(0)
    calls, lengths = 0, []
    with count_compiles() as compiles:
        for longest in range(5, 61, 3):  # contexts growing through the buckets 16, 24, 32, 48, 64
            n = rng.randint(1, 4)
            prompts = [[rng.randrange(97) for _ in range(rng.randint(1, longest))] for _ in range(n - 1)]
            prompts.append([rng.randrange(97) for _ in range(longest)])
            params = [SamplingParams(max_new_tokens=rng.randint(1, 12), temperature=1.0) for _ in prompts]
            outs = sampler.generate(prompts, params, seed=calls)
            assert [len(o.tokens) for o in outs] == [p.max_new_tokens for p in params]  # no stop tokens
            calls += 1
            lengths.append(longest)
    buckets = {length_bucket(n, 16) for n in lengths}
    assert buckets == {16, 24, 32, 48, 64}
    assert compiles["_prefill"] == len(buckets)
    assert compiles["_start"] == len(buckets)  # the cache length follows the prompt bucket alone
    assert 1 <= compiles["_decode_chunk"] <= len(buckets)
    assert calls >= 3 * len(buckets)
    seen = shape_keys_seen(config)
    assert {k[2] for k in seen if k[0] == "prefill"} == buckets and {k[1] for k in seen} == {4}

    # precompile runs exactly the shapes real calls take: afterwards those calls compile nothing
    with count_compiles() as again:
        keys = sampler.precompile(4, [70, 90], max_new_tokens=12)
        assert [k[1] for k in keys] == [96] and again["_prefill"] == 1
        sampler.generate([[1] * 80, [2] * 90], [SamplingParams(max_new_tokens=12)] * 2)
        sampler.generate([[3] * 66], [SamplingParams(max_new_tokens=5)])
    assert again["_prefill"] == again["_start"] == again["_decode_chunk"] == 1


def test_without_headroom_the_cache_shape_follows_the_length_mix():
    # What the headroom bounds: with cache_headroom 0 the cache length depends on prompt + max-new-tokens of each
    # call, so one prompt bucket can take several cache shapes.
    s = Sampler.__new__(Sampler)
    s.config = SamplerConfig(min_prompt_bucket=16, min_cache_bucket=32, max_cache_len=256)
    assert {s.shape_key(2, 20, 20 + m, m)[2] for m in (1, 20, 40)} == {32, 48, 64}
    s.config = SamplerConfig(min_prompt_bucket=16, min_cache_bucket=32, max_cache_len=256, cache_headroom=40)
    assert {s.shape_key(2, 20, 20 + m, m)[2] for m in (1, 20, 40)} == {64}
    # a request longer than the headroom still fits; the cap is the bucket of max_cache_len
    assert s.shape_key(1, 200, 250, 50)[2] == 256
    with pytest.raises(ValueError):
        SamplerConfig(cache_headroom=-1)


def test_new_weights_versions_compile_nothing():
    config = ModelConfig.tiny(vocab_size=89, num_layers=1)
    with count_compiles() as compiles:
        sampler = Sampler(_model(config, 1), SamplerConfig(min_prompt_bucket=16, min_cache_bucket=32))
        sampler.generate([[1, 2, 3]], SamplingParams(max_new_tokens=3))
        first = dict(compiles)
        for seed in (2, 3):  # a new Sampler per version (jax_policy_from_update) and set_weights
            other = Sampler(_model(config, seed), SamplerConfig(min_prompt_bucket=16, min_cache_bucket=32))
            other.set_weights(_model(config, seed + 10))
            other.generate([[4, 5]], SamplingParams(max_new_tokens=3))
    assert first["_split_params"] == 1
    assert compiles == first
