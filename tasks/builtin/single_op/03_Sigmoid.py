"""Sigmoid, elementwise: y = 1 / (1 + exp(-x))."""

import torch
import torch.nn as nn

batch_size = 256
dim = 4096


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.sigmoid(x)


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
