"""Scaled sum: y = alpha * x + z with a constant alpha."""

import torch
import torch.nn as nn

batch_size = 256
dim = 4096
alpha = 2.5


class Model(nn.Module):
    def __init__(self, alpha):
        super().__init__()
        self.alpha = alpha

    def forward(self, x, z):
        return self.alpha * x + z


def get_inputs():
    return [torch.randn(batch_size, dim), torch.randn(batch_size, dim)]


def get_init_inputs():
    return [alpha]
