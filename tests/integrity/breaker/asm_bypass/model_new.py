import torch
import torch.nn as nn
from sandbox.runtime import load_kernels
K = load_kernels()
class ModelNew(nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)
        K.row_softmax(x, out, x.shape[0], x.shape[1])
        return out
