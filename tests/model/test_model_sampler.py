"""The KV-cached sampler against the learner's full forward (fp32, CPU): log-probs, greedy, stops, buckets."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from actors import sampler as sampler_mod
from actors.sampler import (FINISH_LENGTH, FINISH_STOP_STRING, FINISH_STOP_TOKEN, Sampler, SamplerConfig,
                            SamplingParams, batch_bucket, length_bucket)
from learner.model import ModelConfig, Transformer, token_logprobs

CFG = ModelConfig.tiny(vocab_size=300, init_std=0.08)  # larger init: peaked distributions, O(1) log-probs
# One batch bucket (8), prompt bucket 32 and cache bucket 64 for (almost) every test: few compilations.
SCFG = SamplerConfig(min_prompt_bucket=32, min_cache_bucket=64, decode_chunk_steps=8, min_batch_bucket=8)


@pytest.fixture(scope="module")
def model() -> Transformer:
    return Transformer(CFG, nnx.Rngs(11))


@pytest.fixture(scope="module")
def sampler(model) -> Sampler:
    return Sampler(model, SCFG)


def _prompts(lengths, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, CFG.vocab_size, size=n).tolist() for n in lengths]


@jax.jit
def _forward(state, tokens):
    model = nnx.merge(_GRAPHDEF[0], state)
    pos = jnp.broadcast_to(jnp.arange(tokens.shape[1], dtype=jnp.int32)[None], tokens.shape)
    return model(tokens, pos)


_GRAPHDEF: list = []


def _learner_logprobs(model, prompt, completion, temperature, top_k=0, top_p=1.0):
    """The learner's log-probs of the completion: one full forward over prompt + completion (right-padded
    to a fixed shape so that the reference compiles once), then `token_logprobs`."""
    seq = prompt + completion.tokens
    assert len(seq) <= 64
    graphdef, state = nnx.split(model)
    _GRAPHDEF[:] = [graphdef]
    tokens = np.zeros((1, 64), np.int32)
    tokens[0, :len(seq)] = seq
    logits = _forward(state, jnp.asarray(tokens))[:, :len(seq)]
    lp = token_logprobs(logits[:, :-1], jnp.asarray([seq[1:]], jnp.int32), temperature, top_k, top_p)
    return np.asarray(lp[0, len(prompt) - 1:]), np.asarray(logits[0, len(prompt) - 1:-1])


def test_buckets():
    assert [length_bucket(n, 1) for n in (1, 2, 3, 5, 63, 64, 65, 97, 129)] == [1, 2, 3, 6, 64, 64, 96, 128, 192]
    assert length_bucket(5, 64) == 64 and [batch_bucket(n) for n in (1, 3, 16, 17)] == [1, 4, 16, 32]


def test_ragged_batch_logprobs_match_full_forward(model, sampler):
    # Prompt lengths on both sides of bucket edges (16, 24, 32); generations that run past the prompt bucket
    # (32) into the cache; a different max-new-tokens per row. The bucket sizes themselves are covered by
    # test_bucket_boundaries below.
    lengths = [3, 15, 16, 17, 23, 25, 31]
    prompts = _prompts(lengths, seed=1)
    params = [SamplingParams(temperature=0.8, max_new_tokens=m) for m in (30, 9, 20, 17, 1, 26, 12)]
    outs = sampler.generate(prompts, params, seed=3)
    assert (sampler.last_stats["batch"], sampler.last_stats["prompt_bucket"], sampler.last_stats["cache_len"]) == \
        (8, 32, 64)
    worst = 0.0
    for prompt, sp, out in zip(prompts, params, outs):
        assert len(out.tokens) == sp.max_new_tokens and out.finish_reason == FINISH_LENGTH
        assert out.logprobs.dtype == np.float32 and out.logprobs.shape == (len(out.tokens),)
        want, _ = _learner_logprobs(model, prompt, out, sp.temperature)
        worst = max(worst, float(np.abs(want - out.logprobs).max()))
    assert worst <= 1e-3, worst
    assert np.mean([np.mean(o.logprobs) for o in outs]) < -0.05  # the comparison is not between zeros


def test_greedy_is_argmax_and_matches_single_prompt_runs(model, sampler):
    prompts = _prompts([9, 30], seed=2)
    batch = sampler.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=12))
    for prompt, out in zip(prompts, batch):
        lp, logits = _learner_logprobs(model, prompt, out, 1.0)
        assert out.tokens == np.argmax(logits, axis=-1).tolist()
        np.testing.assert_allclose(out.logprobs, lp, atol=1e-3)
        alone = sampler.generate([prompt], SamplingParams(temperature=0.0, max_new_tokens=12))[0]
        assert alone.tokens == out.tokens


def test_stop_tokens_and_max_new_tokens(sampler):
    prompt = _prompts([10], seed=4)[0]
    free = sampler.generate([prompt], SamplingParams(temperature=0.0, max_new_tokens=20))[0]
    stop = free.tokens[5]
    first = free.tokens.index(stop)
    out = sampler.generate([prompt, prompt], [SamplingParams(temperature=0.0, max_new_tokens=20,
                                                             stop_token_ids=(stop, 299)),
                                              SamplingParams(temperature=0.0, max_new_tokens=4)])
    assert out[0].tokens == free.tokens[:first + 1] and out[0].finish_reason == FINISH_STOP_TOKEN
    assert out[1].tokens == free.tokens[:4] and out[1].finish_reason == FINISH_LENGTH


def test_stop_strings(model):
    decode = lambda ids: "".join(chr(65 + (i % 26)) for i in ids)  # a toy detokenizer: one letter per id
    s = Sampler(model, SCFG, decode)
    prompt = _prompts([7], seed=5)[0]
    free = s.generate([prompt], SamplingParams(temperature=0.0, max_new_tokens=24))[0]
    target = decode(free.tokens[9:11])  # completes at token 10 at the latest
    expected = next(j + 1 for j in range(len(free.tokens)) if target in decode(free.tokens[:j + 1]))
    out = s.generate([prompt], SamplingParams(temperature=0.0, max_new_tokens=24, stop_strings=(target,)))[0]
    assert out.finish_reason == FINISH_STOP_STRING and out.tokens == free.tokens[:expected]
    assert len(out.logprobs) == expected
    with pytest.raises(ValueError, match="detokenize"):
        Sampler(model).generate([prompt], SamplingParams(stop_strings=("x",)))


@pytest.mark.parametrize("top_k, top_p", [(5, 1.0), (0, 0.6), (8, 0.9)])
def test_truncated_sampling_logprobs(model, sampler, top_k, top_p):
    prompts = _prompts([6, 21], seed=6)
    sp = SamplingParams(temperature=1.3, top_k=top_k, top_p=top_p, max_new_tokens=15)
    outs = sampler.generate(prompts, sp, seed=7)
    for prompt, out in zip(prompts, outs):
        want, logits = _learner_logprobs(model, prompt, out, 1.3, top_k, top_p)
        np.testing.assert_allclose(out.logprobs, want, atol=1e-3)
        assert np.isfinite(out.logprobs).all()
        if top_k:
            ranks = [(row > row[t]).sum() for row, t in zip(logits, out.tokens)]
            assert max(ranks) < top_k
        untruncated, _ = _learner_logprobs(model, prompt, out, 1.3)
        assert np.all(out.logprobs >= untruncated - 1e-4)  # renormalised over the kept set


def test_bucket_boundaries(model):
    """Prompts just under, at and over a prompt bucket edge, and a cache that grows into the next bucket:
    the log-probs agree whichever buckets a call lands in."""
    s = Sampler(model, SamplerConfig(min_prompt_bucket=16, min_cache_bucket=16, decode_chunk_steps=8,
                                     min_batch_bucket=4))
    prompts = _prompts([15, 16, 17, 33], seed=12)
    sp = SamplingParams(temperature=1.0, max_new_tokens=14)
    outs = s.generate(prompts, sp, seed=1)
    assert (s.last_stats["prompt_bucket"], s.last_stats["cache_len"]) == (48, 48)
    for prompt, out in zip(prompts, outs):
        want, _ = _learner_logprobs(model, prompt, out, 1.0)
        np.testing.assert_allclose(out.logprobs, want, atol=1e-3)


def test_no_recompile_inside_a_bucket(sampler):
    sp = SamplingParams(temperature=1.0, max_new_tokens=5)
    sampler.generate(_prompts([4, 9]), sp)
    sizes = (sampler_mod._prefill._cache_size(), sampler_mod._decode_chunk._cache_size())
    sampler.generate(_prompts([11, 14], seed=9), sp)  # same batch, prompt and cache buckets
    assert (sampler_mod._prefill._cache_size(), sampler_mod._decode_chunk._cache_size()) == sizes


def test_set_weights_and_bad_input(model, sampler):
    prompt = _prompts([8], seed=10)[0]
    before = sampler.generate([prompt], SamplingParams(temperature=0.0, max_new_tokens=6))[0]
    other = Transformer(CFG, nnx.Rngs(12))
    s2 = Sampler(model, SCFG)
    s2.set_weights(other)
    after = s2.generate([prompt], SamplingParams(temperature=0.0, max_new_tokens=6))[0]
    assert after.tokens != before.tokens
    with pytest.raises(ValueError, match="empty"):
        sampler.generate([[]])
    with pytest.raises(ValueError, match="outside"):
        sampler.generate([[CFG.vocab_size]])
    with pytest.raises(ValueError, match="max_cache_len"):
        Sampler(model, SamplerConfig(max_cache_len=32)).generate([prompt], SamplingParams(max_new_tokens=30))
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0.0)


def test_bf16_sampler_close_to_bf16_learner():
    """The bf16 code paths (casts, float32 residual stream): agreement within bf16 rounding, not 1e-3."""
    cfg = CFG.replace(param_dtype="bfloat16", dtype="bfloat16")
    model = Transformer(cfg, nnx.Rngs(11))
    s = Sampler(model, SCFG)
    prompts = _prompts([12, 30], seed=13)
    outs = s.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=20), seed=2)
    for prompt, out in zip(prompts, outs):
        want, _ = _learner_logprobs(model, prompt, out, 1.0)
        assert np.abs(want - out.logprobs).mean() < 0.05 and np.isfinite(out.logprobs).all()
    tokens, pos = jnp.asarray([prompts[0]], jnp.int32), jnp.arange(12, dtype=jnp.int32)[None]
    h32 = model.hidden_states(tokens, pos)
    rounded = Transformer(cfg.replace(residual_float32=False), nnx.Rngs(11))
    h16 = rounded.hidden_states(tokens, pos)
    assert h32.dtype == h16.dtype == jnp.bfloat16
    diff = float(jnp.abs(h32.astype(jnp.float32) - h16.astype(jnp.float32)).max())
    assert 0 < diff < 0.2  # the residual dtype changes only the rounding


def test_non_finite_logits_raise_instead_of_sampling_garbage():
    # A model whose logits are NaN (as cuDNN's unwritten padding rows once made them on the H200): argmax and the
    # categorical draw still return ids, so without the check the episode would go on with meaningless tokens.
    graphdef, state = nnx.split(Transformer(CFG, nnx.Rngs(2)))
    state = jax.tree.map(lambda x: jnp.full_like(x, jnp.nan) if jnp.issubdtype(x.dtype, jnp.floating) else x, state)
    broken = Sampler(nnx.merge(graphdef, state), SCFG)
    for temperature in (0.0, 1.0):
        with pytest.raises(sampler_mod.NonFiniteLogprobs, match=r"non-finite behaviour log-probs in 2 of 2 completions") as e:
            broken.generate(_prompts([5, 9]), SamplingParams(temperature=temperature, max_new_tokens=4), seed=0)
        assert e.value.rows == [0, 1] and len(e.value.completions) == 2


def test_only_the_rows_with_non_finite_logprobs_fail_in_the_policy():
    # One NaN embedding row: the prompt that holds that token fails, the other row of the same batch is delivered.
    from actors.policy import JaxPolicy

    graphdef, state = nnx.split(Transformer(CFG, nnx.Rngs(2)))
    state["backbone"]["embed"][...] = state["backbone"]["embed"][...].at[7].set(jnp.nan)
    policy = JaxPolicy(Sampler(nnx.merge(graphdef, state), SCFG), version=1)
    prompts = [[1, 2, 7, 3], [1, 2, 4, 3]]
    out = policy.generate(prompts, [SamplingParams(temperature=0.0, max_new_tokens=4)] * 2)
    assert isinstance(out[0], FloatingPointError) and "1 of 2 completions" in str(out[0])
    assert 7 not in out[1].tokens and len(out[1].tokens) == 4 and np.isfinite(out[1].logprobs).all()
