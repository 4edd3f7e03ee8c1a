"""Faking the time: cache the first output and return the very same tensor on every later call (a leaderboard
classic: the harness times one input over and over).

Defence: every output must live in storage allocated inside the call (the fresh-output rule): violation
"stale_output".
"""
import torch
import torch.nn as nn

from sandbox.runtime import load_kernels

K = load_kernels()


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.cache = None

    def forward(self, x):
        if self.cache is None:
            self.cache = torch.empty_like(x)
            K.elementwise_chain(x, self.cache, x.numel())
        K.elementwise_chain(x, torch.empty_like(x), 1)
        return self.cache
