"""Not doing the task: return a copy of the input.

Defence: verification against the reference: incorrect on trial 0.
"""
import torch
import torch.nn as nn

from sandbox.runtime import load_kernels

K = load_kernels()


class ModelNew(nn.Module):
    def forward(self, x):
        out = x.clone()
        K.elementwise_chain(x, torch.empty_like(x), 0)
        return out
