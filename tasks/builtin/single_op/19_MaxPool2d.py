"""2D max pooling, 2x2 window, stride 2."""

import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 8
channels = 32
height = 64
width = 64


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return F.max_pool2d(x, kernel_size=2, stride=2)


def get_inputs():
    return [torch.randn(batch_size, channels, height, width)]


def get_init_inputs():
    return []
