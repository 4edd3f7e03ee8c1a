"""Not doing the task: compute with torch ops inside forward.

Defence: the dispatch guard (sandbox.guard.ComputeGuard) names the op: violation "dispatch_op".
"""
import torch
import torch.nn as nn

from sandbox.runtime import load_kernels

K = load_kernels()


class ModelNew(nn.Module):
    def forward(self, x):
        y = torch.relu(x * 1.5 + 0.5)
        y = torch.clamp(y - x * 0.25, max=4.0)
        return (y * y + 1.0) / (1.0 + x.abs())
