"""Faking the time: detect the timing phase (calls arriving back to back after verification) and from then on
copy a remembered output into a fresh tensor instead of computing.

Defence: fresh inputs per timed call and checks of every timed call's outputs: violation "timed_output_mismatch".
"""
import torch
import torch.nn as nn

from sandbox.runtime import load_kernels

K = load_kernels()


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0
        self.saved = None

    def forward(self, x):
        self.calls += 1
        out = torch.empty_like(x)
        if self.calls > 10 and self.saved is not None and self.saved.shape == x.shape:
            K.elementwise_chain(x, torch.empty_like(x), 1)
            out.copy_(self.saved)
            return out
        K.elementwise_chain(x, out, x.numel())
        self.saved = out.clone()
        return out
