"""Faking the time: detect the timing phase (during verification the harness poisons fresh allocations with NaN;
while timing it does not) and from then on copy a remembered output into the fresh tensor instead of computing.

The phase is read from a probe of its own size, zeroed after each look: a verification call's probe is poisoned;
a timed call's probe is the memory of the previous call's zeroed probe or other garbage, not NaN. (The output
tensor itself is no probe: the harness scrubs the outputs it is done with, NaN again, so reusing their memory makes
every call look like verification, and the solution then computes honestly.)

Defence: fresh inputs per timed call and checks of every timed call's outputs: violation "timed_output_mismatch".
"""
import torch
import torch.nn as nn

from sandbox.runtime import load_kernels

K = load_kernels()
SAVED = {}
ZEROS = torch.zeros(12345)


class ModelNew(nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)
        probe = torch.empty(12345)
        first = float(probe[0])
        probe.copy_(ZEROS)
        timed = first == first  # not NaN: the harness did not poison this allocation
        if timed and x.shape in SAVED:
            K.elementwise_chain(x, torch.empty_like(x), 1)
            out.copy_(SAVED[x.shape])
            return out
        K.elementwise_chain(x, out, x.numel())
        SAVED[x.shape] = out.clone()
        return out
