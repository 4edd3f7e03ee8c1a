"""Our Flax model against transformers' PyTorch models: import, logits, export, critic."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

from _model_hf_tiny import FAMILIES, build_hf_model
from learner.hf_checkpoint import load_critic, load_pretrained, read_config, save_pretrained
from learner.model import Critic, ModelConfig, Transformer, token_logprobs


def _tokens(vocab: int, batch: int = 2, length: int = 40, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, vocab, size=(batch, length), dtype=np.int32)


def _ours(model, tokens: np.ndarray, segment_ids=None) -> np.ndarray:
    positions = np.broadcast_to(np.arange(tokens.shape[1], dtype=np.int32), tokens.shape)
    return np.asarray(model(jnp.asarray(tokens), jnp.asarray(positions), segment_ids))


def _theirs(model, tokens: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.from_numpy(tokens.astype(np.int64))).logits.float().numpy()


@pytest.mark.parametrize("family", list(FAMILIES))
def test_logits_match_transformers_fp32(hf_checkpoints, family):
    folder, hf_model = hf_checkpoints[family]
    model = load_pretrained(folder, param_dtype="float32", dtype="float32")
    tokens = _tokens(model.config.vocab_size)
    theirs = _theirs(hf_model, tokens)
    ours = _ours(model, tokens)
    assert theirs.std() > 0.5, "logits too small for the comparison to mean anything"
    np.testing.assert_array_less(np.abs(ours - theirs).max(), 1e-4)


def test_config_mapping(hf_checkpoints):
    q3 = read_config(hf_checkpoints["qwen3"][0])
    assert (q3.qk_norm, q3.qkv_bias, q3.head_dim, q3.tie_embeddings) == (True, False, 24, False)
    q2 = read_config(hf_checkpoints["qwen2_tied_yarn"][0])
    assert q2.qkv_bias and q2.tie_embeddings and q2.rope_scaling["rope_type"] == "yarn"
    ll = read_config(hf_checkpoints["llama3"][0])
    assert ll.rope_scaling["rope_type"] == "llama3" and ll.rope_theta == 500000.0 and not ll.qkv_bias


@pytest.mark.parametrize("family", ["qwen2", "llama3", "qwen3"])
def test_export_loads_back_in_transformers(tmp_path, hf_checkpoints, family):
    import transformers

    folder, hf_model = hf_checkpoints[family]
    model = load_pretrained(folder, param_dtype="float32", dtype="float32")
    # Sharded on purpose (tiny shard limit) to cover the index file on both sides.
    files = save_pretrained(model, tmp_path / "out", dtype="float32", max_shard_bytes=200_000)
    assert (tmp_path / "out" / "model.safetensors.index.json") in files
    assert len([f for f in files if f.suffix == ".safetensors"]) > 1
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32).eval()
    assert type(reloaded).__name__ == type(hf_model).__name__
    tokens = _tokens(model.config.vocab_size, seed=3)
    np.testing.assert_array_less(np.abs(_theirs(reloaded, tokens) - _theirs(hf_model, tokens)).max(), 1e-5)
    # ...and back into ours through the index file.
    again = load_pretrained(tmp_path / "out", param_dtype="float32")
    np.testing.assert_array_less(np.abs(_ours(again, tokens) - _ours(model, tokens)).max(), 1e-6)


def test_bf16_export_and_load(tmp_path, hf_checkpoints):
    folder, _ = hf_checkpoints["qwen2"]
    model = load_pretrained(folder, param_dtype="float32")
    save_pretrained(model, tmp_path / "bf16")  # default dtype bfloat16, single file
    cfg = json.loads((tmp_path / "bf16" / "config.json").read_text())
    assert cfg["torch_dtype"] == "bfloat16" and (tmp_path / "bf16" / "model.safetensors").exists()
    bf = load_pretrained(tmp_path / "bf16")
    assert bf.config.param_dtype == "bfloat16" and bf.backbone.layers.wq[...].dtype == jnp.bfloat16
    tokens = _tokens(model.config.vocab_size, seed=4)
    ours32, ours16 = _ours(model, tokens), _ours(bf, tokens)
    assert np.abs(ours16 - ours32).max() < 0.1 * np.abs(ours32).max()


def test_packed_segments_equal_separate_sequences():
    cfg = ModelConfig.tiny()
    model = Transformer(cfg, nnx.Rngs(3))
    a, b = _tokens(cfg.vocab_size, 1, 7, seed=5), _tokens(cfg.vocab_size, 1, 5, seed=6)
    packed = np.concatenate([a, b, np.zeros((1, 4), np.int32)], axis=1)
    seg = np.array([[1] * 7 + [2] * 5 + [0] * 4], np.int32)
    pos = np.array([list(range(7)) + list(range(5)) + [0] * 4], np.int32)
    out = np.asarray(model(jnp.asarray(packed), jnp.asarray(pos), jnp.asarray(seg)))
    np.testing.assert_allclose(out[:, :7], _ours(model, a), atol=1e-5)
    np.testing.assert_allclose(out[:, 7:12], _ours(model, b), atol=1e-5)
    assert np.isfinite(out).all()


def test_chunked_attention_matches_xla():
    cfg = ModelConfig.tiny()
    model = Transformer(cfg, nnx.Rngs(4))
    chunked = Transformer(cfg.replace(attention_impl="chunked", attention_chunk_size=8), nnx.Rngs(4))
    tokens = _tokens(cfg.vocab_size, 2, 29, seed=7)
    seg = np.array([[1] * 20 + [2] * 9, [1] * 25 + [0] * 4], np.int32)
    pos = np.array([list(range(20)) + list(range(9)), list(range(25)) + [0] * 4], np.int32)
    want = model(jnp.asarray(tokens), jnp.asarray(pos), jnp.asarray(seg))
    got = chunked(jnp.asarray(tokens), jnp.asarray(pos), jnp.asarray(seg))
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5)


def test_remat_gradients_match():
    cfg = ModelConfig.tiny()
    tokens = jnp.asarray(_tokens(cfg.vocab_size, 2, 12, seed=8))
    pos = jnp.broadcast_to(jnp.arange(12), tokens.shape)

    def grads(remat: bool, policy: str = "full"):
        model = Transformer(cfg.replace(remat=remat, remat_policy=policy), nnx.Rngs(5))
        graphdef, state = nnx.split(model)

        def loss(state):
            m = nnx.merge(graphdef, state)
            return -token_logprobs(m(tokens[:, :-1], pos[:, :-1]), tokens[:, 1:]).mean()

        return jax.jit(jax.grad(loss))(state)

    g0, g1, g2 = grads(False), grads(True), grads(True, "save_dots")
    assert len(jax.tree.leaves(g0)) == len(jax.tree.leaves(g2)) > 0
    for x, y, z in zip(jax.tree.leaves(g0), jax.tree.leaves(g1), jax.tree.leaves(g2)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=1e-6)
        np.testing.assert_allclose(np.asarray(x), np.asarray(z), atol=1e-6)


def test_remat_policy_is_validated():
    with pytest.raises(ValueError, match="remat_policy must be one of"):
        ModelConfig.tiny().replace(remat=True, remat_policy="dots")


def test_critic_from_policy_and_own_checkpoint(tmp_path, hf_checkpoints):
    import transformers

    folder, _ = hf_checkpoints["qwen2"]
    policy = load_pretrained(folder, param_dtype="float32")
    critic = Critic.from_policy(policy)
    tokens = _tokens(policy.config.vocab_size, seed=9)
    pos = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
    np.testing.assert_array_equal(np.asarray(critic.hidden_states(tokens, pos)),
                                  np.asarray(policy.hidden_states(tokens, pos)))
    assert critic.backbone.embed[...] is not policy.backbone.embed[...]  # fresh buffers (donation-safe)
    values = critic(jnp.asarray(tokens), pos)
    assert values.shape == tokens.shape and values.dtype == jnp.float32
    # A trained head round-trips through HF's TokenClassification layout.
    critic.value_w.set_value(jax.random.normal(jax.random.key(0), (policy.config.hidden_size, 1)) * 0.1)
    critic.value_b.set_value(jnp.array([0.5]))
    save_pretrained(critic, tmp_path / "critic", dtype="float32")
    hf_critic = transformers.AutoModelForTokenClassification.from_pretrained(tmp_path / "critic").eval()
    with torch.no_grad():
        theirs = hf_critic(torch.from_numpy(tokens.astype(np.int64))).logits[..., 0].numpy()
    np.testing.assert_allclose(np.asarray(critic(jnp.asarray(tokens), pos)), theirs, atol=1e-4)
    again = load_critic(tmp_path / "critic")
    np.testing.assert_allclose(np.asarray(again(jnp.asarray(tokens), pos)), theirs, atol=1e-4)
    # From a causal-LM checkpoint: the policy's backbone and a zero head.
    fresh = load_critic(folder, param_dtype="float32")
    assert float(jnp.abs(fresh(jnp.asarray(tokens), pos)).max()) == 0.0


def test_partition_names_are_the_agreed_ones():
    model = Transformer(ModelConfig.tiny(qk_norm=True))
    specs = jax.tree.leaves(nnx.get_partition_spec(nnx.state(model)),
                            is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))
    allowed = {"vocab", "embed", "q_heads", "kv_heads", "head_dim", "mlp", None}
    names = {n for spec in specs for n in spec}
    assert names <= allowed and {"vocab", "embed", "q_heads", "kv_heads", "mlp"} <= names
    assert nnx.get_partition_spec(nnx.state(model))["backbone"]["layers"]["wq"].get_value() == \
        jax.sharding.PartitionSpec(None, "embed", "q_heads", "head_dim")


def test_config_loads_through_omegaconf():
    from cuda_agent.config import load_config

    cfg = load_config(ModelConfig, overrides=["num_layers=3", "rope_scaling={rope_type: linear, factor: 2.0}"])
    assert cfg.num_layers == 3 and cfg.rope_scaling == {"rope_type": "linear", "factor": 2.0}
    with pytest.raises(ValueError, match="attention_impl"):
        ModelConfig(attention_impl="flash")
