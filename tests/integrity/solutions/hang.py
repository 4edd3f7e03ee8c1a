"""Resource attack: hang inside forward.

Defence: the per-stage wall-clock limit kills the candidate's process tree: status timeout.
"""
import torch
import torch.nn as nn

from sandbox.runtime import load_kernels

K = load_kernels()


class ModelNew(nn.Module):
    def forward(self, x):
        while True:
            pass
