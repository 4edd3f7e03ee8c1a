"""Operator categories, and the category of a task inferred from its normalised operator sequence."""

from __future__ import annotations

from typing import Sequence

# Every category the registry and the built-in set use. "activation" and "elementwise" are both pointwise;
# they are kept apart because pointwise math dominates any random mix otherwise.
CATEGORIES = (
    "elementwise", "activation", "reduction", "normalization", "softmax", "matmul", "conv", "pooling",
    "attention", "scan", "loss", "layout",
)

# Canonical op (tasks.trace.canonical_op) -> category, for tasks that did not come from our composer.
_OP_CATEGORY = {
    "sdpa": "attention", "_native_multi_head_attention": "attention",
    "conv": "conv", "convolution_backward": "conv",
    "matmul": "matmul", "dot": "matmul", "vdot": "matmul", "mv": "matmul", "addmv": "matmul",
    "layer_norm": "normalization", "group_norm": "normalization", "batch_norm": "normalization",
    "rms_norm": "normalization", "instance_norm": "normalization",
    "max_pool": "pooling", "avg_pool": "pooling", "adaptive_avg_pool": "pooling", "adaptive_max_pool": "pooling",
    "max_pool2d_with_indices": "pooling", "max_pool3d_with_indices": "pooling",
    "softmax": "softmax", "log_softmax": "softmax",
    "cumsum": "scan", "cumprod": "scan", "cummax": "scan", "cummin": "scan", "logcumsumexp": "scan",
    "mse_loss": "loss", "l1_loss": "loss", "smooth_l1_loss": "loss", "huber_loss": "loss",
    "nll_loss_forward": "loss", "nll_loss": "loss", "kl_div": "loss", "binary_cross_entropy": "loss",
    "binary_cross_entropy_with_logits": "loss", "cosine_similarity": "loss", "norm": "reduction",
    "sum": "reduction", "mean": "reduction", "amax": "reduction", "amin": "reduction", "max": "reduction",
    "min": "reduction", "var": "reduction", "std": "reduction", "var_mean": "reduction", "prod": "reduction",
    "logsumexp": "reduction", "linalg_vector_norm": "reduction", "argmax": "reduction", "argmin": "reduction",
    "relu": "activation", "gelu": "activation", "silu": "activation", "sigmoid": "activation",
    "tanh": "activation", "elu": "activation", "leaky_relu": "activation", "hardtanh": "activation",
    "hardswish": "activation", "hardsigmoid": "activation", "mish": "activation", "softplus": "activation",
    "glu": "activation", "log_sigmoid_forward": "activation", "celu": "activation", "selu": "activation",
    "prelu": "activation", "_prelu_kernel": "activation", "threshold": "activation",
    "transpose": "layout", "permute": "layout", "flip": "layout", "roll": "layout", "constant_pad_nd": "layout",
    "cat": "layout", "pixel_shuffle": "layout", "pixel_unshuffle": "layout", "upsample_nearest2d": "layout",
    "upsample_bilinear2d": "layout", "repeat": "layout", "stack": "layout",
}

# When a task mixes categories, the first of these it contains names it (heaviest / most specific first).
_PRIORITY = ("attention", "conv", "matmul", "normalization", "pooling", "softmax", "scan", "loss", "reduction",
             "layout", "activation", "elementwise")


def op_category(canonical: str) -> str:
    """Category of one canonical op name; unknown ops count as elementwise."""
    return _OP_CATEGORY.get(canonical, "elementwise")


def infer_category(signature: Sequence[str]) -> str:
    """Category of a task from its normalised operator sequence (see tasks.trace): the highest-priority one."""
    present = {op_category(op) for op in signature}
    for c in _PRIORITY:
        if c in present:
            return c
    return "elementwise"
