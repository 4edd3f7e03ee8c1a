"""A throwaway causal transformer with the learner.model interface, for the learner's tests.

Same call signature as `learner.model.Transformer` / `Critic`: `model(tokens [B,T] int32, positions [B,T]
int32, segment_ids [B,T] int32 | None) -> logits [B,T,V] f32` (values `[B,T]` for the critic); parameters
annotated with the same logical axis names ("vocab", "embed", "q_heads", "kv_heads", "head_dim", "mlp").
Tests switch to `learner.model` once it exists (see `policy_and_critic` below).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

P = nnx.with_partitioning


@dataclasses.dataclass(frozen=True)
class TinyConfig:
    vocab_size: int = 32
    embed: int = 32
    heads: int = 2
    head_dim: int = 16
    mlp: int = 64
    layers: int = 1
    max_positions: int = 256


class _Block(nnx.Module):
    def __init__(self, c: TinyConfig, rngs: nnx.Rngs):
        init = nnx.initializers.lecun_normal()
        self.c = c
        self.qkv = nnx.Einsum(
            "btd,dshk->btshk",
            (c.embed, 3, c.heads, c.head_dim),
            kernel_init=P(init, ("embed", None, "q_heads", "head_dim")),
            rngs=rngs,
        )
        self.out = nnx.Einsum(
            "bthk,hkd->btd", (c.heads, c.head_dim, c.embed), kernel_init=P(init, ("q_heads", "head_dim", "embed")), rngs=rngs
        )
        self.up = nnx.Linear(c.embed, c.mlp, kernel_init=P(init, ("embed", "mlp")), use_bias=False, rngs=rngs)
        self.down = nnx.Linear(c.mlp, c.embed, kernel_init=P(init, ("mlp", "embed")), use_bias=False, rngs=rngs)
        self.ln1 = nnx.RMSNorm(c.embed, rngs=rngs)
        self.ln2 = nnx.RMSNorm(c.embed, rngs=rngs)

    def __call__(self, h, allowed):
        qkv = self.qkv(self.ln1(h))
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        s = jnp.einsum("bqhk,bshk->bhqs", q, k) / jnp.sqrt(self.c.head_dim).astype(h.dtype)
        s = jnp.where(allowed[:, None], s, -1e9)
        a = jnp.einsum("bhqs,bshk->bqhk", jax.nn.softmax(s, axis=-1), v)
        h = h + self.out(a)
        return h + self.down(jax.nn.gelu(self.up(self.ln2(h))))


class _Trunk(nnx.Module):
    def __init__(self, c: TinyConfig, rngs: nnx.Rngs):
        self.c = c
        emb_init = nnx.initializers.normal(0.5)
        self.embed = nnx.Embed(c.vocab_size, c.embed, embedding_init=P(emb_init, ("vocab", "embed")), rngs=rngs)
        self.pos = nnx.Embed(c.max_positions, c.embed, embedding_init=P(emb_init, (None, "embed")), rngs=rngs)
        self.blocks = nnx.List([_Block(c, rngs) for _ in range(c.layers)])
        self.ln = nnx.RMSNorm(c.embed, rngs=rngs)

    def __call__(self, tokens, positions, segment_ids=None):
        T = tokens.shape[1]
        causal = jnp.tril(jnp.ones((T, T), bool))[None]
        if segment_ids is not None:
            same = segment_ids[:, :, None] == segment_ids[:, None, :]
            allowed = causal & same
        else:
            allowed = jnp.broadcast_to(causal, (tokens.shape[0], T, T))
        allowed = allowed | jnp.eye(T, dtype=bool)[None]
        h = self.embed(tokens) + self.pos(jnp.clip(positions, 0, self.c.max_positions - 1))
        for b in self.blocks:
            h = b(h, allowed)
        return self.ln(h)


class TinyLM(nnx.Module):
    def __init__(self, c: TinyConfig, rngs: nnx.Rngs):
        self.trunk = _Trunk(c, rngs)
        self.head = nnx.Linear(c.embed, c.vocab_size, kernel_init=P(nnx.initializers.lecun_normal(), ("embed", "vocab")), use_bias=False, rngs=rngs)

    def __call__(self, tokens, positions, segment_ids=None):
        return self.head(self.trunk(tokens, positions, segment_ids)).astype(jnp.float32)


class TinyCritic(nnx.Module):
    def __init__(self, c: TinyConfig, rngs: nnx.Rngs):
        self.trunk = _Trunk(c, rngs)
        self.value_head = nnx.Linear(c.embed, 1, kernel_init=P(nnx.initializers.zeros_init(), ("embed", None)), rngs=rngs)

    def __call__(self, tokens, positions, segment_ids=None):
        return self.value_head(self.trunk(tokens, positions, segment_ids))[..., 0].astype(jnp.float32)


def make_policy(c: TinyConfig = TinyConfig(), seed: int = 0) -> TinyLM:
    with nnx.use_eager_sharding(False):
        return TinyLM(c, nnx.Rngs(seed))


def make_critic(c: TinyConfig = TinyConfig(), seed: int = 1) -> TinyCritic:
    with nnx.use_eager_sharding(False):
        return TinyCritic(c, nnx.Rngs(seed))
