import torch
import torch.nn as nn

from sandbox.runtime import load_kernels

K = load_kernels()


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        x = x.contiguous()
        cols = x.shape[-1]
        rows = x.numel() // cols
        sums = torch.empty(x.shape[:-1], dtype=x.dtype, device=x.device)
        maxs = torch.empty(x.shape[:-1], dtype=x.dtype, device=x.device)
        K.relu_row_stats(x, sums, maxs, rows, cols, grid=(rows,), block=(256,))
        return sums, maxs
