"""Shared test setup: `gpu` tests are skipped where no NVIDIA GPU is visible to torch."""

import functools

import pytest


@functools.cache
def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if _has_cuda():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (gpu marker)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
