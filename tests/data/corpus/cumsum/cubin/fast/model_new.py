import torch
import torch.nn as nn

from sandbox.runtime import load_kernels

K = load_kernels()
THREADS = 256


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        x = x.contiguous()
        out = torch.empty_like(x)
        n = x.shape[-1]
        rows = x.numel() // n
        K.row_cumsum(x, out, rows, n, grid=(rows,), block=(THREADS,))
        return out
