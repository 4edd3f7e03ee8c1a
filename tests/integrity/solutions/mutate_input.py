"""Taking the answer: write the result into the input (so a harness that runs the reference afterwards on the same
tensor would compare against f(f(x))) and return it.

Defence: the reference ran in the trusted worker before the candidate saw the input; the candidate worker rejects an
output that aliases an input: violation "alias" (or "input_mutation").
"""
import torch
import torch.nn as nn

from sandbox.runtime import load_kernels

K = load_kernels()


class ModelNew(nn.Module):
    def forward(self, x):
        K.elementwise_chain(x, x, x.numel())
        return x
