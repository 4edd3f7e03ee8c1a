"""RMS normalisation over the last dimension, with a learned scale: y = x / sqrt(mean(x^2) + eps) * w."""

import torch
import torch.nn as nn

batch_size = 256
dim = 2048


class Model(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.eps = 1e-6
        self.weight = nn.Parameter(torch.rand(dim) + 0.5)

    def forward(self, x):
        rms = torch.sqrt(torch.mean(x * x, dim=-1, keepdim=True) + self.eps)
        return x / rms * self.weight


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return [dim]
