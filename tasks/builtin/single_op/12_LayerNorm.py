"""Layer normalisation over the last dimension, with learned scale and shift."""

import torch
import torch.nn as nn

batch_size = 256
dim = 2048


class Model(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.norm = nn.LayerNorm(dim)

    def forward(self, x):
        return self.norm(x)


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return [dim]
