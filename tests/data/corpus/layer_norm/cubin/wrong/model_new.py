import torch
import torch.nn as nn

from sandbox.runtime import load_kernels

K = load_kernels()


class ModelNew(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.ln = nn.LayerNorm(dim, eps=1e-5)  # receives the reference's weight and bias

    def forward(self, x):
        x = x.contiguous()
        out = torch.empty_like(x)
        cols = x.shape[-1]
        rows = x.numel() // cols
        K.layer_norm(x, self.ln.weight, self.ln.bias, out, rows, cols, self.ln.eps, grid=(rows,), block=(256,))
        return out
