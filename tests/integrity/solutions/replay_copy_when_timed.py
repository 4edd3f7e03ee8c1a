"""Faking the time: detect the timing phase (during verification the harness poisons fresh outputs with NaN; while
timing it does not) and from then on copy a remembered output into the fresh tensor instead of computing.

Defence: fresh inputs per timed call and checks of every timed call's outputs: violation "timed_output_mismatch".
"""
import torch
import torch.nn as nn

from sandbox.runtime import load_kernels

K = load_kernels()
SAVED = {}


class ModelNew(nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)
        first = float(out.view(-1)[0])
        timed = first == first  # not NaN: the harness did not poison this allocation
        if timed and x.shape in SAVED:
            K.elementwise_chain(x, torch.empty_like(x), 1)
            out.copy_(SAVED[x.shape])
            return out
        K.elementwise_chain(x, out, x.numel())
        SAVED[x.shape] = out.clone()
        return out
