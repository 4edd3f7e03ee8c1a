"""GPU checks of the model (run by scripts/gpu_check.sh on a CUDA host): cuDNN attention against the XLA
reference, and the bf16 sampler against the bf16 learner on one small model."""

from __future__ import annotations

import os

import numpy as np
import pytest

# Share the GPU with torch-based tests of the same session: JAX allocates on demand here (only takes effect
# when JAX has not started its GPU backend yet).
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")


def _poison_device_memory(n_bytes: int = 512 << 20) -> None:
    """Fill device memory with NaN and free it, so that buffers allocated next start out NaN (XLA's allocator
    reuses freed blocks): a kernel that leaves part of its output unwritten then shows it."""
    import jax.numpy as jnp

    poison = jnp.full((n_bytes // 4,), jnp.nan, jnp.float32)
    poison.block_until_ready()
    del poison


@pytest.mark.gpu
def test_cudnn_attention_zeroes_the_rows_past_each_length():
    # cuDNN writes no output for query rows past a sequence length; the sampler's prefill (right padding) keeps
    # the keys / values made from them in its KV cache, where NaN would poison every later decode step (the h200
    # preset's first PPO rollouts all had NaN behaviour log-probs).
    import jax
    import jax.numpy as jnp

    from learner.model import ModelConfig, attend

    cfg = ModelConfig.tiny(num_heads=4, num_kv_heads=2, head_dim=64, dtype="bfloat16", attention_impl="cudnn")
    rng = np.random.default_rng(0)
    q = jnp.asarray(rng.standard_normal((2, 256, 4, 64)), jnp.bfloat16)
    k, v = (jnp.asarray(rng.standard_normal((2, 256, 2, 64)), jnp.bfloat16) for _ in range(2))
    lengths = jnp.asarray([37, 200], jnp.int32)
    run = jax.jit(lambda q, k, v, n: attend(cfg, q, k, v, None, n))
    ref = attend(cfg.replace(attention_impl="xla"), q, k, v, None, lengths).astype(jnp.float32)
    for _ in range(3):
        _poison_device_memory()
        out = np.asarray(run(q, k, v, lengths).astype(jnp.float32))
        assert np.isfinite(out).all()
        assert not out[0, 37:].any() and not out[1, 200:].any()
        np.testing.assert_allclose(out[0, :37], np.asarray(ref[0, :37]), atol=0.05)
        np.testing.assert_allclose(out[1, :200], np.asarray(ref[1, :200]), atol=0.05)


@pytest.mark.gpu
def test_cudnn_attention_and_bf16_sampler_on_gpu():
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from actors.sampler import Sampler, SamplerConfig, SamplingParams
    from learner.model import ModelConfig, Transformer, token_logprobs

    cfg = ModelConfig.tiny(hidden_size=256, num_heads=4, num_kv_heads=2, head_dim=64, intermediate_size=512,
                           vocab_size=512, param_dtype="bfloat16", dtype="bfloat16", init_std=0.05)
    xla = Transformer(cfg, nnx.Rngs(0))
    cudnn = Transformer(cfg.replace(attention_impl="cudnn"), nnx.Rngs(0))
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(0, 512, (2, 256)), jnp.int32)
    pos = jnp.broadcast_to(jnp.arange(256, dtype=jnp.int32)[None], tokens.shape)
    seg = jnp.asarray(np.repeat([[1] * 100 + [2] * 156], 2, axis=0), jnp.int32)
    for s in (None, seg):
        a, b = np.asarray(xla(tokens, pos, s)), np.asarray(cudnn(tokens, pos, s))
        assert np.abs(a - b).max() < 0.05 * np.abs(a).max()

    sampler = Sampler(cudnn, SamplerConfig(min_prompt_bucket=64, min_cache_bucket=128))
    prompts = [rng.integers(0, 512, n).tolist() for n in (17, 64, 90)]
    _poison_device_memory()  # the prefill's padding rows must not pick up what was there
    outs = sampler.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=24), seed=0)
    diffs = []
    for prompt, out in zip(prompts, outs):
        seq = jnp.asarray([prompt + out.tokens], jnp.int32)
        p = jnp.arange(seq.shape[1] - 1, dtype=jnp.int32)[None]
        lp = token_logprobs(cudnn(seq[:, :-1], p), seq[:, 1:], 1.0)[0, len(prompt) - 1:]
        diffs.append(np.abs(np.asarray(lp) - out.logprobs))
    diffs = np.concatenate(diffs)
    assert diffs.mean() < 0.02 and np.isfinite(diffs).all()
    assert jax.devices()[0].platform == "gpu"


@pytest.mark.gpu
def test_cudnn_packed_segments_match_xla_with_gradients():
    """Packed rows through cuDNN's packed layout (learner.model.packed_segments): outputs and q/k/v gradients at
    the non-padding positions agree with the XLA reference; a row layout the packed path cannot take (padding
    between segments) goes through the chunked XLA path and agrees too."""
    import jax
    import jax.numpy as jnp

    from learner.model import ModelConfig, attend, packed_segments

    cfg = ModelConfig.tiny(num_heads=4, num_kv_heads=2, head_dim=64, dtype="bfloat16", attention_impl="cudnn")
    ref_cfg = cfg.replace(attention_impl="xla")
    rng = np.random.default_rng(0)
    b, t = 3, 256
    q, k, v = (jnp.asarray(rng.standard_normal((b, t, n, 64)), jnp.bfloat16) for n in (4, 2, 2))
    packed_rows = np.zeros((b, t), np.int32)
    packed_rows[0, :256] = np.repeat([1, 2, 3], [100, 60, 96])
    packed_rows[1, :200] = np.repeat([1, 2, 3, 4, 5], [10, 50, 1, 39, 100])  # 56 padding tokens at the end
    packed_rows[2, :256] = 1
    other = packed_rows.copy()
    other[0, 100:110] = 0  # padding between segments: not the packed layout
    assert bool(packed_segments(packed_rows, cfg.attention_max_segments)[2])
    assert not bool(packed_segments(other, cfg.attention_max_segments)[2])
    for seg in (packed_rows, other):
        seg_j = jnp.asarray(seg)
        ct = jnp.asarray(rng.standard_normal((b, t, 4, 64)) * (seg != 0)[:, :, None, None], jnp.float32)

        def loss(q, k, v, c):
            return jnp.sum(attend(c, q, k, v, seg_j).astype(jnp.float32) * ct)

        _poison_device_memory()  # cuDNN leaves padding rows of outputs and gradients unwritten: NaN must not show
        out = np.asarray(attend(cfg, q, k, v, seg_j), np.float32)
        ref = np.asarray(attend(ref_cfg, q, k, v, seg_j), np.float32)
        keep = seg != 0
        assert np.isfinite(out[keep]).all()
        assert np.abs(out[keep] - ref[keep]).max() < 0.03 * np.abs(ref[keep]).max()
        _poison_device_memory()
        g = jax.grad(loss, argnums=(0, 1, 2))(q, k, v, cfg)
        g_ref = jax.grad(loss, argnums=(0, 1, 2))(q, k, v, ref_cfg)
        for a, r in zip(g, g_ref):
            a, r = np.asarray(a, np.float32), np.asarray(r, np.float32)
            assert np.isfinite(a).all()
            assert np.abs(a - r).max() < 0.03 * np.abs(r).max()
