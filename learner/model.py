"""The policy model: a decoder-only transformer in Flax NNX, the critic, and the shared log-prob helper.

One definition serves the learner (full forward, training) and the actors' sampler (`actors/sampler.py`, KV
cache), so both compute the same function. It covers the Qwen2 / Qwen2.5, Qwen3 and Llama-3 layouts: RMSNorm,
rotary embeddings (default, linear, llama3 and yarn scaling), grouped-query attention, SwiGLU MLP, optional QKV
bias (Qwen2) and QK-norm (Qwen3), tied or untied embeddings. Hugging Face import/export: `learner/hf_checkpoint.py`.

Layout. The layers' parameters are stacked on a leading layer axis (`[L, ...]`) and the forward runs
`jax.lax.scan` over them (one compiled layer body, fast compiles for deep models; `config.remat` wraps the body
in `jax.checkpoint`). The per-layer math lives in pure functions (`layer_qkv`, `attend`, `layer_out`) over a
dict of one layer's arrays; the sampler calls the same functions layer by layer on unstacked arrays.

Sharding. Every parameter carries logical axis names in its `out_sharding` metadata (Flax >= 0.12.4 name; read
them with `nnx.get_partition_spec(nnx.state(model))`), using only "vocab", "embed", "q_heads", "kv_heads",
"head_dim", "mlp", and None for replicated dims (the stacked layer axis and norm scales are None). Without a
mesh the model is created unsharded (Flax's eager sharding is switched off for the construction); under
`jax.set_mesh(mesh)` with `nnx.logical_axis_rules(rules)` Flax shards the variables at birth.

Jit idiom (the whole repository): `jax.jit` over pure functions of `(graphdef, state)`, with
`graphdef, state = nnx.split(model)` outside and `model = nnx.merge(graphdef, state)` inside; `graphdef` is a
static argument (hashable: `ModelConfig` hashes by value).

Shapes: B batch, T sequence, D hidden, H query heads, K kv heads, Dh head dim, F MLP width, V vocab, L layers.
Source of the architecture: the Qwen2 / Qwen3 / Llama reference implementations in `transformers`, which the
tests in `tests/model/` compare against to 1e-4 (fp32 logits).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import math
from typing import Any, Dict, Optional

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from learner.config import REMAT_POLICIES

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
ATTENTION_IMPLS = ("xla", "cudnn", "chunked")
ROPE_TYPES = ("default", "linear", "llama3", "yarn")
_NEG_INF = -1e30  # finite "minus infinity" for masked attention scores (fully masked rows stay finite)


@dataclasses.dataclass
class ModelConfig:
    """Shape and numerics of the transformer. Field names follow the usual Hugging Face meanings."""

    vocab_size: int = 151936
    """Rows of the embedding table (and of the output head)."""
    hidden_size: int = 896
    """Model width D."""
    num_layers: int = 24
    """Decoder layers L."""
    num_heads: int = 14
    """Query heads H."""
    num_kv_heads: int = 2
    """Key/value heads K (grouped-query attention; H must be a multiple of K)."""
    head_dim: int = 64
    """Per-head width Dh (even, for rotary embeddings)."""
    intermediate_size: int = 4864
    """SwiGLU MLP width F."""
    rope_theta: float = 1_000_000.0
    """Rotary base."""
    rope_scaling: Optional[Dict[str, Any]] = None
    """None, or {"rope_type": "linear"|"llama3"|"yarn", "factor": ..., ...} as in Hugging Face configs."""
    rms_norm_eps: float = 1e-6
    """RMSNorm epsilon."""
    tie_embeddings: bool = True
    """Output head shares the embedding table."""
    qkv_bias: bool = True
    """Biases on the q/k/v projections (Qwen2)."""
    qk_norm: bool = False
    """RMSNorm over Dh on queries and keys before rotary embedding (Qwen3)."""
    param_dtype: str = "float32"
    """Storage dtype of the parameters: "float32" or "bfloat16"."""
    dtype: str = "float32"
    """Compute dtype of activations and matmuls: "float32" or "bfloat16" (norms and softmax run in float32)."""
    residual_float32: bool = True
    """Keep the residual stream in float32 (layer inputs are cast to `dtype` for the matmuls). With bf16
    compute this cuts the bf16 rounding that accumulates over the layers, and with it the log-prob
    mismatch between two implementations (sampler and learner); False rounds the stream to `dtype` after
    every layer, as Hugging Face's bf16 models do."""
    max_position_embeddings: int = 32768
    """Longest position the checkpoint was made for (informational; yarn's default original length)."""
    remat: bool = False
    """Recompute each layer's activations in the backward pass (jax.checkpoint around the scanned layer)."""
    remat_policy: str = "full"
    """What a rematerialised layer keeps for the backward pass: "full" keeps only the layer's input (everything
    is recomputed); "save_dots" also keeps the outputs of its projection matmuls (jax.checkpoint_policies.
    dots_with_no_batch_dims_saveable: norms, rotary, activations and attention are recomputed, the projections
    are not). save_dots costs about 2 bytes x (3 x hidden + 2 x kv width + 3 x intermediate) per token and
    layer in bf16. Only read when `remat` is on."""
    attention_impl: str = "xla"
    """"xla": scores materialised [B,H,T,T] (any backend; the reference); "cudnn": cuDNN flash attention
    (NVIDIA GPU, bf16 compute); "chunked": queries in chunks of `attention_chunk_size` under jax.checkpoint
    (any backend, memory O(T * chunk))."""
    attention_chunk_size: int = 512
    """Query chunk of the "chunked" attention."""
    attention_max_segments: int = 64
    """"cudnn" with segment ids (sequence packing): rows holding at most this many segments, laid out as
    learner/batch.py packs them (ids 1, 2, ... in order, padding 0 only at the end), go through cuDNN's packed
    (ragged) layout (`packed_segments`); other layouts take the "chunked" XLA path. The choice is made on the
    device per batch (jax.lax.cond), so both are compiled, and XLA reserves memory for the larger of the two even
    when it is not taken: hence chunked, O(T * attention_chunk_size), as the other branch. 0 here: cuDNN with a
    dense [B, 1, T, T] mask for every layout, whose backward also computes and writes the mask's gradient (jax's
    cuDNN wrapper exports a bias gradient whenever it gets a mask): slower (benchmarks/attention_bench.py) and
    O(T^2) memory."""
    init_std: float = 0.02
    """Standard deviation of the random normal initialisation of matrices."""

    def __post_init__(self) -> None:
        positive = ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                    "intermediate_size", "max_position_embeddings", "attention_chunk_size")
        for name in positive:
            if int(getattr(self, name)) <= 0:
                raise ValueError(f"ModelConfig.{name} must be > 0, got {getattr(self, name)}")
        if self.attention_max_segments < 0 or self.attention_max_segments == 1:
            raise ValueError(f"ModelConfig.attention_max_segments must be 0 (dense mask only) or >= 2, "
                             f"got {self.attention_max_segments}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"ModelConfig.num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                             f"({self.num_kv_heads})")
        if self.head_dim % 2:
            raise ValueError(f"ModelConfig.head_dim must be even for rotary embeddings, got {self.head_dim}")
        for name in ("param_dtype", "dtype"):
            if getattr(self, name) not in DTYPES:
                raise ValueError(f"ModelConfig.{name} must be one of {sorted(DTYPES)}, got {getattr(self, name)!r}")
        if self.attention_impl not in ATTENTION_IMPLS:
            raise ValueError(f"ModelConfig.attention_impl must be one of {ATTENTION_IMPLS}, "
                             f"got {self.attention_impl!r}")
        if self.remat_policy not in REMAT_POLICIES:
            raise ValueError(f"ModelConfig.remat_policy must be one of {REMAT_POLICIES}, got {self.remat_policy!r}")
        if self.rope_theta <= 0:
            raise ValueError(f"ModelConfig.rope_theta must be > 0, got {self.rope_theta}")
        if self.rope_scaling is not None:
            self.rope_scaling = dict(self.rope_scaling)
            kind = self.rope_scaling.get("rope_type", self.rope_scaling.get("type", "default"))
            if kind not in ROPE_TYPES:
                raise ValueError(f"ModelConfig.rope_scaling: rope_type {kind!r} is not supported; "
                                 f"supported: {ROPE_TYPES}")
            if kind != "default" and "factor" not in self.rope_scaling:
                raise ValueError(f"ModelConfig.rope_scaling: rope_type {kind!r} needs a 'factor'")
            if kind == "llama3":
                for key in ("low_freq_factor", "high_freq_factor", "original_max_position_embeddings"):
                    if key not in self.rope_scaling:
                        raise ValueError(f"ModelConfig.rope_scaling: llama3 needs {key!r}")

    def __hash__(self) -> int:  # graphdefs hold the config and must be hashable (jit static argument)
        return hash(json.dumps(dataclasses.asdict(self), sort_keys=True, default=str))

    @property
    def jnp_param_dtype(self):
        return DTYPES[self.param_dtype]

    @property
    def jnp_dtype(self):
        return DTYPES[self.dtype]

    @property
    def residual_dtype(self):
        return jnp.float32 if self.residual_float32 else DTYPES[self.dtype]

    def replace(self, **changes: Any) -> "ModelConfig":
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def tiny(cls, **overrides: Any) -> "ModelConfig":
        """A few-thousand-parameter Qwen2-like config for tests (fp32, 2 layers, GQA 4:2)."""
        base = dict(vocab_size=256, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                    intermediate_size=128, rope_theta=10_000.0, max_position_embeddings=2048,
                    tie_embeddings=False, qkv_bias=True)
        base.update(overrides)
        return cls(**base)

    @classmethod
    def qwen2_5_0_5b(cls, **overrides: Any) -> "ModelConfig":
        """The shape of Qwen2.5-0.5B (and Qwen2.5-Coder-0.5B): 24 layers, D 896, 14/2 heads, tied embeddings."""
        base = dict(vocab_size=151936, hidden_size=896, num_layers=24, num_heads=14, num_kv_heads=2, head_dim=64,
                    intermediate_size=4864, rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_embeddings=True,
                    qkv_bias=True, max_position_embeddings=32768)
        base.update(overrides)
        return cls(**base)

    @classmethod
    def qwen2_5_7b(cls, **overrides: Any) -> "ModelConfig":
        """The shape of Qwen2.5-7B (and Qwen2.5-Coder-7B): 28 layers, D 3584, 28/4 heads, untied embeddings."""
        base = dict(vocab_size=152064, hidden_size=3584, num_layers=28, num_heads=28, num_kv_heads=4,
                    head_dim=128, intermediate_size=18944, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
                    tie_embeddings=False, qkv_bias=True, max_position_embeddings=32768)
        base.update(overrides)
        return cls(**base)

    def num_params(self) -> int:
        """Total parameter count (embedding and output head counted once each; once if tied)."""
        d, f, h, k, dh, v = (self.hidden_size, self.intermediate_size, self.num_heads, self.num_kv_heads,
                             self.head_dim, self.vocab_size)
        attn = d * h * dh * 2 + d * k * dh * 2 + (h * dh + 2 * k * dh if self.qkv_bias else 0)
        per_layer = attn + 3 * d * f + 2 * d + (2 * dh if self.qk_norm else 0)
        return v * d * (1 if self.tie_embeddings else 2) + self.num_layers * per_layer + d


# ----------------------------------------------------------------------------------------------- rotary


def rope_frequencies(config: ModelConfig) -> tuple[np.ndarray, float]:
    """Inverse frequencies `[Dh/2]` float32 and the cos/sin scale ("attention factor", yarn only).

    Formulas: default RoFormer (Su et al. 2021); "linear" position interpolation (Chen et al. 2023);
    "llama3" the Llama 3.1 wavelength-banded scaling; "yarn" (Peng et al. 2023) with beta_fast/beta_slow ramps
    and attention factor 0.1 ln(factor) + 1, as Hugging Face's `modeling_rope_utils` defines them.
    """
    dim = config.head_dim
    base = np.float32(config.rope_theta)
    exponents = np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / np.float32(dim)
    inv_freq = (np.float32(1.0) / (base ** exponents)).astype(np.float32)
    scaling = config.rope_scaling or {}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return inv_freq, 1.0
    factor = float(scaling["factor"])
    if kind == "linear":
        return (inv_freq / np.float32(factor)).astype(np.float32), 1.0
    if kind == "llama3":
        low = float(scaling["low_freq_factor"])
        high = float(scaling["high_freq_factor"])
        original = float(scaling["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv_freq
        low_wavelen, high_wavelen = original / low, original / high
        scaled = np.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (original / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        return np.where(medium, smoothed, scaled).astype(np.float32), 1.0
    # yarn
    original = float(scaling.get("original_max_position_embeddings") or config.max_position_embeddings)
    attention_factor = scaling.get("attention_factor")
    if attention_factor is None:
        def mscale(scale: float, m: float = 1.0) -> float:
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0
        m, m_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
        attention_factor = mscale(factor, m) / mscale(factor, m_all) if (m and m_all) else mscale(factor)
    beta_fast = scaling.get("beta_fast") or 32
    beta_slow = scaling.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(config.rope_theta))

    lo, hi = correction_dim(beta_fast), correction_dim(beta_slow)
    if scaling.get("truncate", True):
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, dim - 1)
    if lo == hi:
        hi += 0.001
    ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - lo) / (hi - lo), 0, 1).astype(np.float32)
    extrapolation = 1 - ramp
    pos_freqs = base ** exponents
    interp = np.float32(1.0) / (np.float32(factor) * pos_freqs)
    extra = np.float32(1.0) / pos_freqs
    inv = interp * (1 - extrapolation) + extra * extrapolation
    return inv.astype(np.float32), float(attention_factor)


def rope_cos_sin(config: ModelConfig, positions: jax.Array) -> tuple[jax.Array, jax.Array]:
    """cos, sin `[B, T, Dh/2]` float32 for integer positions `[B, T]`."""
    inv_freq, scale = rope_frequencies(config)
    angles = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)[None, None, :]
    return jnp.cos(angles) * scale, jnp.sin(angles) * scale


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotate halves of `x [B, T, N, Dh]` (the non-interleaved "rotate_half" convention); float32 math."""
    half = x.shape[-1] // 2
    xf = x.astype(jnp.float32)
    x1, x2 = xf[..., :half], xf[..., half:]
    c, s = cos[:, :, None, :], sin[:, :, None, :]
    return jnp.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1).astype(x.dtype)


# -------------------------------------------------------------------------------------- layer functions


def rms_norm(x: jax.Array, weight: jax.Array, eps: float, out_dtype=None) -> jax.Array:
    """RMSNorm over the last axis, statistics in float32; the normalised values are cast to `out_dtype`
    (default x's dtype) and multiplied by `weight` in that dtype."""
    out = x.dtype if out_dtype is None else out_dtype
    xf = x.astype(jnp.float32)
    normed = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    return normed.astype(out) * weight.astype(out)


def layer_qkv(config: ModelConfig, p: dict, x: jax.Array, cos: jax.Array, sin: jax.Array):
    """Pre-norm and q/k/v projections of one layer, with QK-norm and rotary embedding applied.

    x `[B, T, D]` (residual stream) -> q `[B, T, H, Dh]`, k and v `[B, T, K, Dh]` (compute dtype).
    """
    dt = config.jnp_dtype
    h = rms_norm(x, p["input_norm"], config.rms_norm_eps, dt)
    q = jnp.einsum("btd,dhk->bthk", h, p["wq"].astype(dt))
    k = jnp.einsum("btd,dhk->bthk", h, p["wk"].astype(dt))
    v = jnp.einsum("btd,dhk->bthk", h, p["wv"].astype(dt))
    if config.qkv_bias:
        q, k, v = q + p["bq"].astype(dt), k + p["bk"].astype(dt), v + p["bv"].astype(dt)
    if config.qk_norm:
        q = rms_norm(q, p["q_norm"], config.rms_norm_eps)
        k = rms_norm(k, p["k_norm"], config.rms_norm_eps)
    return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v


def layer_out(config: ModelConfig, p: dict, x: jax.Array, attn: jax.Array) -> jax.Array:
    """Output projection + residual, then the SwiGLU MLP block + residual. attn `[B, T, H, Dh]`; x and the
    result are the residual stream (float32 when config.residual_float32)."""
    dt = config.jnp_dtype
    x = x + jnp.einsum("bthk,hkd->btd", attn, p["wo"].astype(dt))
    h = rms_norm(x, p["post_norm"], config.rms_norm_eps, dt)
    gate = jnp.einsum("btd,df->btf", h, p["w_gate"].astype(dt))
    up = jnp.einsum("btd,df->btf", h, p["w_up"].astype(dt))
    return x + jnp.einsum("btf,fd->btd", jax.nn.silu(gate) * up, p["w_down"].astype(dt))


def attention_mask(q_index: jax.Array, kv_index: jax.Array, q_segment: jax.Array,
                   kv_segment: jax.Array) -> jax.Array:
    """Causal, same-segment, non-padding mask `[B, Tq, Tk]` from indices `[B, T]` and segment ids `[B, T]`."""
    causal = kv_index[:, None, :] <= q_index[:, :, None]
    same = q_segment[:, :, None] == kv_segment[:, None, :]
    return causal & same & (kv_segment[:, None, :] != 0)


def _attend_masked(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
    """Softmax attention with materialised scores. q `[B,T,H,Dh]`, k/v `[B,S,K,Dh]`, mask `[B,T,S]`."""
    b, t, h, dh = q.shape
    kh = k.shape[2]
    qg = q.reshape(b, t, kh, h // kh, dh)
    scores = jnp.einsum("btkgd,bskd->bkgts", qg, k, preferred_element_type=jnp.float32) / math.sqrt(dh)
    scores = jnp.where(mask[:, None, None, :, :], scores, _NEG_INF)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    return jnp.einsum("bkgts,bskd->btkgd", probs, v).reshape(b, t, h, dh)


def packed_segments(segment_ids: jax.Array, max_segments: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The segment lengths and start offsets of packed rows, in the form of cuDNN's packed (ragged) attention
    layout (jax._src.cudnn.fused_attention_stablehlo.dot_product_attention's q_seqlen / q_offsets).

    segment_ids `[B, T]` int -> seqlens `[B, M]` int32, offsets `[B, M + 1]` int32, ok `[]` bool, with
    M = max_segments. Row b's segment m (id m + 1) has seqlens[b, m] tokens and starts at offsets[b, m];
    entries past the row's last segment are -1. `ok` is True when every row is laid out as learner/batch.py
    packs it (ids 1, 2, ... in order, each segment contiguous, padding 0 only after the last segment, at most
    M segments) and at least one row holds a segment; the packed layout is exact only then.
    """
    s = segment_ids.astype(jnp.int32)
    b, t = s.shape
    prev = s[:, :-1]
    nxt = s[:, 1:]
    steps = (nxt == prev) | ((prev > 0) & (nxt == prev + 1)) | (nxt == 0)
    n_seg = jnp.max(s, axis=1)  # [B]
    ok = (jnp.all((s[:, 0] == 0) | (s[:, 0] == 1)) & jnp.all(steps) & jnp.all(n_seg <= max_segments)
          & jnp.any(n_seg > 0))
    ids = jnp.arange(1, max_segments + 1, dtype=jnp.int32)
    counts = jnp.sum((s[:, :, None] == ids[None, None, :]).astype(jnp.int32), axis=1)  # [B, M]
    present = ids[None, :] <= n_seg[:, None]
    seqlens = jnp.where(present, counts, -1)
    starts = jnp.cumsum(counts, axis=1) - counts
    offsets = jnp.concatenate([jnp.where(present, starts, -1), jnp.full((b, 1), -1, jnp.int32)], axis=1)
    return seqlens, offsets, ok


@functools.lru_cache(maxsize=None)
def packed_kv_offsets_follow_key_heads() -> bool:
    """Whether the installed jax scales the packed layout's key/value offsets by the key's own head count.

    jax's cuDNN wrapper (`_fix_seqlen_offsets`) multiplies both offset tensors by a per-token stride; up to jax
    0.10.2 it used the query's heads for the keys too, so with grouped-query attention every key segment but the
    first was read from the wrong place, silently (fixed upstream in jax-ml/jax#39521). Checked by running that
    conversion on a 2-query-head / 1-kv-head example (no GPU needed); False too when the private function has
    moved or changed."""
    try:
        from jax._src.cudnn import fused_attention_stablehlo as fa

        seqlens = jnp.array([[1, 1]], jnp.int32)
        offsets = jnp.array([[0, 1, -1]], jnp.int32)
        *_, kv_offsets = fa._fix_seqlen_offsets(seqlens, seqlens, offsets, offsets,
                                                jnp.zeros((1, 2, 2, 8), jnp.bfloat16),
                                                jnp.zeros((1, 2, 1, 8), jnp.bfloat16))
        return int(np.asarray(kv_offsets).ravel()[1]) == 8  # token 1 of a 1-head, 8-wide key (the bug gives 16)
    except Exception:  # noqa: BLE001 - any change of the private API: take the safe path
        return False


def _cudnn_packed_attention(q: jax.Array, k: jax.Array, v: jax.Array, seqlens: jax.Array,
                            offsets: jax.Array) -> jax.Array:
    """cuDNN flash attention over packed rows (causal within each segment; Hopper or newer). Shapes as in
    `attend`; seqlens / offsets from `packed_segments`. The public jax.nn.dot_product_attention takes no
    segments, so this calls the cuDNN wrapper it is built on. Where that wrapper mis-scales grouped-query key
    offsets (`packed_kv_offsets_follow_key_heads`), keys and values are repeated to the query's heads first."""
    from jax._src.cudnn.fused_attention_stablehlo import MaskType
    from jax._src.cudnn.fused_attention_stablehlo import dot_product_attention as cudnn_attention

    if k.shape[2] != q.shape[2] and not packed_kv_offsets_follow_key_heads():
        group = q.shape[2] // k.shape[2]
        k, v = jnp.repeat(k, group, axis=2), jnp.repeat(v, group, axis=2)
    return cudnn_attention(q, k, v, q_seqlen=seqlens, kv_seqlen=seqlens, q_offsets=offsets, kv_offsets=offsets,
                           scale=1.0 / math.sqrt(q.shape[-1]), mask_type=MaskType.PADDING_CAUSAL,
                           qkv_layout="BTNH")


def _zero_padding(x: jax.Array, valid: jax.Array) -> jax.Array:
    """x `[B,T,N,Dh]` with the positions where valid `[B,T]` is False set to 0, by a select: its gradient is the
    incoming one selected the same way, so NaN written (or left unwritten) there by a kernel goes no further."""
    return jnp.where(valid[:, :, None, None], x, jnp.zeros((), x.dtype))


def attend(config: ModelConfig, q: jax.Array, k: jax.Array, v: jax.Array, segment_ids: jax.Array | None,
           lengths: jax.Array | None = None) -> jax.Array:
    """Causal self-attention over one sequence block: q `[B,T,H,Dh]`, k/v `[B,T,K,Dh]` -> `[B,T,H,Dh]`.

    Masking: token i attends to j <= i when segment_ids[i] == segment_ids[j] != 0 (sequence packing;
    0 is padding); `lengths [B]` (right padding: tokens at index >= length are padding) may stand in for
    segment ids. Outputs at padding positions are finite and meaningless.
    """
    b, t = q.shape[:2]
    if segment_ids is None and lengths is not None:
        segment_ids = (jnp.arange(t)[None, :] < lengths[:, None]).astype(jnp.int32)
    impl = config.attention_impl
    if impl == "cudnn":
        if segment_ids is None or lengths is not None:
            seq = None if lengths is None else lengths.astype(jnp.int32)
            if seq is None:
                return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn")
            # cuDNN leaves the rows past a length unwritten (NaN seen on the H200): a sampler's KV cache keeps the
            # keys / values of those positions, and a weight of 0 on a NaN value is NaN in the decode's matmul
            valid = segment_ids != 0
            q, k, v = (_zero_padding(x, valid) for x in (q, k, v))
            out = jax.nn.dot_product_attention(q, k, v, is_causal=True, query_seq_lengths=seq,
                                               key_value_seq_lengths=seq, implementation="cudnn")
            return _zero_padding(out, valid)

        def dense_mask(q, k, v):
            seg_mask = (segment_ids[:, :, None] == segment_ids[:, None, :]) & (segment_ids[:, None, :] != 0)
            return jax.nn.dot_product_attention(q, k, v, mask=seg_mask[:, None], is_causal=True,
                                                implementation="cudnn")

        if not config.attention_max_segments:
            return dense_mask(q, k, v)
        seqlens, offsets, ok = packed_segments(segment_ids, config.attention_max_segments)

        def packed(q, k, v):
            # cuDNN writes neither the outputs nor, in the backward, the q / k / v gradients of padding positions
            # (NaN on the H200: the first warm-start step's gradient was NaN). Zeroing both sides with a select
            # makes the forward finite there and drops whatever the backward left in those rows.
            valid = segment_ids != 0
            q, k, v = (_zero_padding(x, valid) for x in (q, k, v))
            return _zero_padding(_cudnn_packed_attention(q, k, v, seqlens, offsets), valid)

        def other_layout(q, k, v):  # memory O(T * chunk): a [B, 1, T, T] mask would be allocated even untaken
            return _attend_chunked(q, k, v, segment_ids, config.attention_chunk_size)

        return jax.lax.cond(ok, packed, other_layout, q, k, v)
    if segment_ids is None:
        segment_ids = jnp.ones((b, t), jnp.int32)
    if impl == "xla" or t <= config.attention_chunk_size:
        index = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32)[None, :], (b, t))
        return _attend_masked(q, k, v, attention_mask(index, index, segment_ids, segment_ids))
    return _attend_chunked(q, k, v, segment_ids, config.attention_chunk_size)


def _attend_chunked(q: jax.Array, k: jax.Array, v: jax.Array, segment_ids: jax.Array, chunk: int) -> jax.Array:
    """`_attend_masked` one query chunk at a time under jax.checkpoint (memory O(B * H * chunk * T)); any
    segment layout. Shapes as in `attend`."""
    b, t = q.shape[:2]
    index = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32)[None, :], (b, t))
    pad = (-t) % chunk
    qp = jnp.pad(q, ((0, 0), (0, pad), (0, 0), (0, 0)))
    idx_p = jnp.pad(index, ((0, 0), (0, pad)))
    seg_p = jnp.pad(segment_ids, ((0, 0), (0, pad)))
    n = (t + pad) // chunk
    q_chunks = qp.reshape(b, n, chunk, *q.shape[2:]).swapaxes(0, 1)
    idx_chunks = idx_p.reshape(b, n, chunk).swapaxes(0, 1)
    seg_chunks = seg_p.reshape(b, n, chunk).swapaxes(0, 1)

    @jax.checkpoint
    def one_chunk(qc, ic, sc):
        return _attend_masked(qc, k, v, attention_mask(ic, index, sc, segment_ids))

    out = jax.lax.map(lambda xs: one_chunk(*xs), (q_chunks, idx_chunks, seg_chunks))
    return out.swapaxes(0, 1).reshape(b, t + pad, *q.shape[2:])[:, :t]


def layer_forward(config: ModelConfig, p: dict, x: jax.Array, cos: jax.Array, sin: jax.Array,
                  segment_ids: jax.Array | None, lengths: jax.Array | None = None) -> jax.Array:
    """One full decoder layer over `x [B, T, D]`."""
    q, k, v = layer_qkv(config, p, x, cos, sin)
    return layer_out(config, p, x, attend(config, q, k, v, segment_ids, lengths))


# ------------------------------------------------------------------------------------------ modules


def _no_mesh() -> bool:
    try:
        return jax.sharding.get_abstract_mesh().empty
    except Exception:  # pragma: no cover - older jax
        return True


def _eager_sharding_context():
    """Flax shards annotated variables at birth when a mesh is set; without one, build them unsharded."""
    if _no_mesh() and hasattr(nnx, "use_eager_sharding"):
        return nnx.use_eager_sharding(False)
    return contextlib.nullcontext()


def _param(value: jax.Array, names: tuple) -> nnx.Param:
    if _no_mesh():
        try:
            return nnx.Param(value, out_sharding=names, eager_sharding=False)
        except TypeError:  # pragma: no cover - a Flax without the per-variable switch
            pass
    return nnx.Param(value, out_sharding=names)


def _normal(rngs: nnx.Rngs, shape: tuple, config: ModelConfig) -> jax.Array:
    return (config.init_std * jax.random.normal(rngs.params(), shape, jnp.float32)).astype(
        config.jnp_param_dtype)


class DecoderLayers(nnx.Module):
    """All decoder layers, each parameter stacked on a leading layer axis `[L, ...]`.

    Attribute names are the keys of the per-layer dict the layer functions take (`layer_params()`).
    """

    def __init__(self, config: ModelConfig, rngs: nnx.Rngs):
        c = config
        L, D, H, K, Dh, F = (c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim,
                             c.intermediate_size)
        pdt = c.jnp_param_dtype
        self.input_norm = _param(jnp.ones((L, D), pdt), (None, None))
        self.wq = _param(_normal(rngs, (L, D, H, Dh), c), (None, "embed", "q_heads", "head_dim"))
        self.wk = _param(_normal(rngs, (L, D, K, Dh), c), (None, "embed", "kv_heads", "head_dim"))
        self.wv = _param(_normal(rngs, (L, D, K, Dh), c), (None, "embed", "kv_heads", "head_dim"))
        if c.qkv_bias:
            self.bq = _param(jnp.zeros((L, H, Dh), pdt), (None, "q_heads", "head_dim"))
            self.bk = _param(jnp.zeros((L, K, Dh), pdt), (None, "kv_heads", "head_dim"))
            self.bv = _param(jnp.zeros((L, K, Dh), pdt), (None, "kv_heads", "head_dim"))
        if c.qk_norm:
            self.q_norm = _param(jnp.ones((L, Dh), pdt), (None, None))
            self.k_norm = _param(jnp.ones((L, Dh), pdt), (None, None))
        self.wo = _param(_normal(rngs, (L, H, Dh, D), c), (None, "q_heads", "head_dim", "embed"))
        self.post_norm = _param(jnp.ones((L, D), pdt), (None, None))
        self.w_gate = _param(_normal(rngs, (L, D, F), c), (None, "embed", "mlp"))
        self.w_up = _param(_normal(rngs, (L, D, F), c), (None, "embed", "mlp"))
        self.w_down = _param(_normal(rngs, (L, F, D), c), (None, "mlp", "embed"))

    def param_names(self) -> list[str]:
        return [name for name, value in vars(self).items() if isinstance(value, nnx.Param)]

    def layer_params(self) -> dict[str, jax.Array]:
        """{name: stacked array `[L, ...]`}."""
        return {name: getattr(self, name)[...] for name in self.param_names()}


class Backbone(nnx.Module):
    """Embedding, decoder layers and final norm: tokens `[B, T]` -> final hidden states `[B, T, D]`."""

    def __init__(self, config: ModelConfig, rngs: nnx.Rngs):
        self.config = config
        with _eager_sharding_context():
            self.embed = _param(_normal(rngs, (config.vocab_size, config.hidden_size), config), ("vocab", "embed"))
            self.layers = DecoderLayers(config, rngs)
            self.final_norm = _param(jnp.ones((config.hidden_size,), config.jnp_param_dtype), (None,))

    def __call__(self, tokens: jax.Array, positions: jax.Array, segment_ids: jax.Array | None = None,
                 lengths: jax.Array | None = None) -> jax.Array:
        config = self.config
        x = jnp.take(self.embed[...], tokens, axis=0).astype(config.jnp_dtype).astype(config.residual_dtype)
        cos, sin = rope_cos_sin(config, positions)

        def body(carry, layer):
            return layer_forward(config, layer, carry, cos, sin, segment_ids, lengths), None

        if config.remat:
            policy = (jax.checkpoint_policies.dots_with_no_batch_dims_saveable if config.remat_policy == "save_dots"
                      else None)
            body = jax.checkpoint(body, prevent_cse=False, policy=policy)
        x, _ = jax.lax.scan(body, x, self.layers.layer_params())
        return rms_norm(x, self.final_norm[...], config.rms_norm_eps, config.jnp_dtype)


class Transformer(nnx.Module):
    """The policy: `model(tokens [B,T] int32, positions [B,T] int32, segment_ids [B,T] int32 | None)` ->
    logits `[B, T, V]` float32.

    segment_ids: 0 is padding; tokens with equal non-zero ids attend to each other causally (packing).
    positions: rotary positions (restart at 0 for each packed sequence). Tokens must lie in [0, V).
    """

    def __init__(self, config: ModelConfig, rngs: nnx.Rngs | None = None):
        rngs = nnx.Rngs(0) if rngs is None else rngs
        self.config = config
        self.backbone = Backbone(config, rngs)
        if not config.tie_embeddings:
            with _eager_sharding_context():
                self.lm_head = _param(_normal(rngs, (config.vocab_size, config.hidden_size), config),
                                      ("vocab", "embed"))

    def head_weight(self) -> jax.Array:
        """The output projection `[V, D]` (the embedding table when tied)."""
        return self.backbone.embed[...] if self.config.tie_embeddings else self.lm_head[...]

    def hidden_states(self, tokens: jax.Array, positions: jax.Array,
                      segment_ids: jax.Array | None = None) -> jax.Array:
        """Final hidden states `[B, T, D]` (after the final norm; compute dtype)."""
        return self.backbone(tokens, positions, segment_ids)

    def logits(self, hidden: jax.Array) -> jax.Array:
        """Output head over hidden states `[..., D]` -> logits `[..., V]` float32 (float32 accumulation)."""
        w = self.head_weight().astype(self.config.jnp_dtype)
        return jnp.einsum("...d,vd->...v", hidden.astype(self.config.jnp_dtype), w,
                          preferred_element_type=jnp.float32)

    def __call__(self, tokens: jax.Array, positions: jax.Array,
                 segment_ids: jax.Array | None = None) -> jax.Array:
        return self.logits(self.hidden_states(tokens, positions, segment_ids))


class Critic(nnx.Module):
    """The value model: the same backbone plus a scalar head. `critic(tokens, positions, segment_ids)` ->
    values `[B, T]` float32 (the value of the state after each token).

    Hugging Face export maps it to `*ForTokenClassification` with one label (`score.weight`, `score.bias`).
    """

    def __init__(self, config: ModelConfig, rngs: nnx.Rngs | None = None):
        rngs = nnx.Rngs(0) if rngs is None else rngs
        self.config = config
        self.backbone = Backbone(config, rngs)
        with _eager_sharding_context():
            self.value_w = _param(jnp.zeros((config.hidden_size, 1), jnp.float32), ("embed", None))
            self.value_b = _param(jnp.zeros((1,), jnp.float32), (None,))

    @classmethod
    def from_policy(cls, model: Transformer, rngs: nnx.Rngs | None = None) -> "Critic":
        """A critic whose backbone is a copy (fresh buffers) of the policy's; the value head starts at zero."""
        critic = nnx.eval_shape(lambda: cls(model.config, nnx.Rngs(0)))
        state = jax.tree.map(jnp.copy, nnx.state(model.backbone))
        nnx.update(critic.backbone, state)
        with _eager_sharding_context():
            critic.value_w = _param(jnp.zeros((model.config.hidden_size, 1), jnp.float32), ("embed", None))
            critic.value_b = _param(jnp.zeros((1,), jnp.float32), (None,))
        return critic

    def hidden_states(self, tokens: jax.Array, positions: jax.Array,
                      segment_ids: jax.Array | None = None) -> jax.Array:
        return self.backbone(tokens, positions, segment_ids)

    def __call__(self, tokens: jax.Array, positions: jax.Array,
                 segment_ids: jax.Array | None = None) -> jax.Array:
        h = self.hidden_states(tokens, positions, segment_ids).astype(jnp.float32)
        return (h @ self.value_w[...])[..., 0] + self.value_b[...][0]


# ------------------------------------------------------------------------------------------ log-probs


def _truncation_off(top_k: Any, top_p: Any) -> bool:
    return (isinstance(top_k, (int, np.integer)) and int(top_k) == 0
            and isinstance(top_p, (float, int, np.floating)) and float(top_p) >= 1.0)


def truncate_logits(logits: jax.Array, top_k: Any = 0, top_p: Any = 1.0) -> jax.Array:
    """Set logits outside the top-k / top-p (nucleus) set to -inf. logits `[..., V]` float32 (tempered).

    top_k: int or int array broadcastable to `logits.shape[:-1]`; 0 keeps all. top_p: float or array
    likewise; 1.0 keeps all. Order as in Hugging Face and vLLM: top-k first, then top-p on the renormalised
    top-k distribution, keeping the smallest prefix of the sorted tokens whose mass reaches top_p (the most
    likely token is always kept). Tokens tied with the last kept logit are kept too.
    """
    v = logits.shape[-1]
    top_k = jnp.asarray(top_k, jnp.int32)
    top_p = jnp.asarray(top_p, jnp.float32)
    desc = -jnp.sort(-logits, axis=-1)
    k = jnp.where(top_k > 0, jnp.minimum(top_k, v), v)
    rank = jnp.arange(v, dtype=jnp.int32)
    in_k = rank < k[..., None]
    probs = jax.nn.softmax(jnp.where(in_k, desc, -jnp.inf), axis=-1)
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    keep = in_k & (mass_before < top_p[..., None])
    n_keep = jnp.maximum(jnp.sum(keep, axis=-1), 1)
    threshold = jnp.take_along_axis(desc, (n_keep - 1)[..., None], axis=-1)
    return jnp.where(logits >= threshold, logits, -jnp.inf)


def token_logprobs(logits: jax.Array, targets: jax.Array, temperature: Any = 1.0, top_k: Any = 0,
                   top_p: Any = 1.0) -> jax.Array:
    """log softmax(logits / temperature) gathered at `targets`: logits `[B, T, V]`, targets `[B, T]` ->
    `[B, T]` float32. The sampler and the learner both call this, so behaviour and learner log-probs agree.

    temperature: > 0, a float or an array broadcastable to `targets`. With top_k / top_p off (0 / 1.0, the
    defaults) this is the tempered full-vocabulary distribution. When the sampler truncates (top-k / top-p),
    its behaviour log-probs are those of the distribution it actually sampled from: the tempered logits
    truncated by `truncate_logits` and renormalised over the kept set. The learner gets the same numbers by
    passing the same top_k / top_p here; without them it gets the untruncated log-probs, which are lower by
    log(kept mass) at each token. RL runs usually sample with top_p=1, top_k=0 so the two coincide.
    """
    x = logits.astype(jnp.float32)
    t = jnp.asarray(temperature, jnp.float32)
    x = x / (t[..., None] if t.ndim else t)
    if not _truncation_off(top_k, top_p):
        x = truncate_logits(x, top_k, top_p)
    picked = jnp.take_along_axis(x, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
    return picked - jax.nn.logsumexp(x, axis=-1)


def chunked_token_logprobs(model: Transformer, hidden: jax.Array, targets: jax.Array, temperature: Any = 1.0,
                           chunk_size: int = 1024) -> jax.Array:
    """`token_logprobs(model.logits(hidden), targets, temperature)` computed `chunk_size` positions at a time
    under jax.checkpoint, so `[B, T, V]` logits never exist at once (long sequences). hidden `[B, T, D]`,
    targets `[B, T]` -> `[B, T]` float32. temperature must be a scalar here.
    """
    b, t = targets.shape
    if t <= chunk_size:
        return token_logprobs(model.logits(hidden), targets, temperature)
    pad = (-t) % chunk_size
    hp = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0)))
    tp = jnp.pad(targets, ((0, 0), (0, pad)))
    n = (t + pad) // chunk_size
    h_chunks = hp.reshape(b, n, chunk_size, -1).swapaxes(0, 1)
    t_chunks = tp.reshape(b, n, chunk_size).swapaxes(0, 1)
    w = model.head_weight()

    @jax.checkpoint
    def one(hc, tc):
        logits = jnp.einsum("btd,vd->btv", hc, w.astype(hc.dtype), preferred_element_type=jnp.float32)
        return token_logprobs(logits, tc, temperature)

    out = jax.lax.map(lambda xs: one(*xs), (h_chunks, t_chunks))
    return out.swapaxes(0, 1).reshape(b, t + pad)[:, :t]
