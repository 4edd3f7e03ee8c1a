import math
import torch
import torch.nn as nn
from sandbox.runtime import load_kernels
K = load_kernels()
class ModelNew(nn.Module):
    def forward(self, x):
        a = x.numpy()
        m = a.max(axis=-1, keepdims=True)
        e = math.e ** (a - m)
        out = e / e.sum(axis=-1, keepdims=True)
        return torch.from_numpy(out.astype(a.dtype))
