import torch
import torch.nn as nn

from sandbox.runtime import load_kernels

K = load_kernels()
TILE = 16


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        a = a.contiguous()
        b = b.contiguous()
        m, k = a.shape
        n = b.shape[1]
        c = torch.empty(m, n, dtype=a.dtype, device=a.device)
        K.matmul(a, b, c, m, n, k, grid=((n + TILE - 1) // TILE, (m + TILE - 1) // TILE), block=(TILE, TILE))
        return c
