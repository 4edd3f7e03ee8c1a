# Hostile: holds 1 GiB of touched memory for the whole evaluation.
import torch
import torch.nn as nn

from sandbox.runtime import load_kernels

K = load_kernels()
HOG = bytearray(1 << 30)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        x = x.contiguous()
        out = torch.empty_like(x)
        K.elementwise_chain(x, out, x.numel())
        return out
