"""Fixtures for the model tests: tiny random Hugging Face checkpoints built locally (no hub access)."""

from __future__ import annotations

import pytest

from _model_hf_tiny import FAMILIES, build_hf_model


@pytest.fixture(scope="session")
def hf_checkpoints(tmp_path_factory):
    """{family: (folder, torch model)} saved with transformers' own save_pretrained (single safetensors)."""
    out = {}
    for family in FAMILIES:
        model = build_hf_model(family)
        folder = tmp_path_factory.mktemp(family)
        model.save_pretrained(folder)
        out[family] = (folder, model)
    return out
