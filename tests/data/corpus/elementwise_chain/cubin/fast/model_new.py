import torch
import torch.nn as nn

from sandbox.runtime import load_kernels

K = load_kernels()


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        x = x.contiguous()
        out = torch.empty_like(x)
        n = x.numel()
        K.elementwise_chain(x, out, n, grid=(min((n + 255) // 256, 65535),), block=(256,))
        return out
