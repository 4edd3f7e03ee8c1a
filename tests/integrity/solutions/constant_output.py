"""Not doing the task: a constant output (the mean of the expected output), after a launch that does no work.

Defence: verification against the reference on fresh-seed inputs: incorrect on trial 0.
"""
import torch
import torch.nn as nn

from sandbox.runtime import load_kernels

K = load_kernels()


class ModelNew(nn.Module):
    def forward(self, x):
        out = torch.full_like(x, 1.0)
        K.elementwise_chain(x, out, 0)
        return out
