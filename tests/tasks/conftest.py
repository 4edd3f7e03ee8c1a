"""Shared fixtures of the tasks tests."""

from pathlib import Path

import pytest

FIXTURE = Path(__file__).resolve().parents[1] / "data" / "kernelbench_fixture"

GOOD = '''import torch
import torch.nn as nn

batch_size = 4
dim = 32


class Model(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.linear = nn.Linear(dim, dim)

    def forward(self, x):
        return torch.relu(self.linear(x))


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return [dim]
'''


@pytest.fixture
def kb_fixture() -> Path:
    return FIXTURE


@pytest.fixture
def good_source() -> str:
    return GOOD
