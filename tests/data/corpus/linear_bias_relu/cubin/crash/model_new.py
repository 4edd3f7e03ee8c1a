import torch
import torch.nn as nn

from sandbox.runtime import load_kernels

K = load_kernels()
TILE = 16


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)  # receives the reference's weight [out, in] and bias

    def forward(self, x):
        x = x.contiguous()
        w = self.linear.weight
        batch, out_f, in_f = x.shape[0], w.shape[0], w.shape[1]
        out = torch.empty(batch, out_f, dtype=x.dtype, device=x.device)
        K.linear_bias_relu(x, w, self.linear.bias, out, batch, in_f, out_f,
                           grid=((out_f + TILE - 1) // TILE, (batch + TILE - 1) // TILE), block=(TILE, TILE))
        return out
