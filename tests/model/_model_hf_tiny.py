"""Tiny random Hugging Face models built locally (no hub access) for the model tests."""

from __future__ import annotations

FAMILIES = {
    # name: (transformers config class, model class, extra config)
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(tie_word_embeddings=False)),
    "qwen2_tied_yarn": ("Qwen2Config", "Qwen2ForCausalLM", dict(
        tie_word_embeddings=True,
        rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32})),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=24, tie_word_embeddings=False)),
    "llama3": ("LlamaConfig", "LlamaForCausalLM", dict(
        tie_word_embeddings=False, rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 16})),
}


def build_hf_model(family: str, seed: int = 0, **overrides):
    """A tiny transformers model of `family` with float32 weights perturbed to give O(1) logits, so that a
    1e-4 comparison of logits means something (default init gives logits near 0)."""
    import torch
    import transformers

    cfg_name, model_name, extra = FAMILIES[family]
    kwargs = dict(vocab_size=320, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6,
                  rope_theta=10000.0)
    kwargs.update(extra)
    kwargs.update(overrides)
    config = getattr(transformers, cfg_name)(**kwargs)
    torch.manual_seed(seed)
    model = getattr(transformers, model_name)(config).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1 and "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif p.ndim == 1:
                p.copy_(0.3 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / p.shape[-1] ** 0.5)
    return model
