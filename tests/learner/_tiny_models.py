"""Tiny instances of the project's model (learner.model) for the learner's tests."""

from __future__ import annotations

from flax import nnx

from learner.model import Critic, ModelConfig, Transformer

#: 1 layer, width 32, 2 query heads over 1 kv head, vocabulary 32: compiles in about a second on CPU.
TINY = ModelConfig.tiny(vocab_size=32, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16,
                        intermediate_size=64, max_position_embeddings=512)


def make_policy(config: ModelConfig = TINY, seed: int = 0) -> Transformer:
    return Transformer(config, nnx.Rngs(seed))


def make_critic(config: ModelConfig = TINY, seed: int = 1) -> Critic:
    return Critic(config, nnx.Rngs(seed))
