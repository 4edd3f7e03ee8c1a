import torch
import torch.nn as nn

from sandbox.runtime import load_kernels

K = load_kernels()


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)  # takes the reference's weight [out, in] and bias

    def forward(self, x):
        x = x.contiguous()
        w = self.linear.weight
        out = torch.empty(x.shape[0], w.shape[0], dtype=x.dtype, device=x.device)
        K.linear_bias_relu(x, w, self.linear.bias, out, x.shape[0], w.shape[1], w.shape[0])
        return out
