"""Disabling the guard: run torch ops with Python dispatch disabled (torch._C._DisableTorchDispatch), so the
dispatch-mode guard never sees them.

Defence: the context managers and functions that change the dispatch-mode stack or dispatch keys are refused when
solution code calls them: violation "guard_bypass".
"""
import torch
import torch.nn as nn

from sandbox.runtime import load_kernels

K = load_kernels()


class ModelNew(nn.Module):
    def forward(self, x):
        with torch._C._DisableTorchDispatch():
            y = torch.relu(x * 1.5 + 0.5)
            y = torch.clamp(y - x * 0.25, max=4.0)
            return (y * y + 1.0) / (1.0 + x.abs())
