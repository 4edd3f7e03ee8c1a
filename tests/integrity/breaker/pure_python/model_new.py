import math
import torch
import torch.nn as nn
from sandbox.runtime import load_kernels
K = load_kernels()
class ModelNew(nn.Module):
    def forward(self, x):
        rows = x.tolist()
        res = []
        for r in rows:
            m = max(r)
            e = [math.exp(v - m) for v in r]
            s = sum(e)
            res.append([v / s for v in e])
        return torch.tensor(res, dtype=x.dtype)
