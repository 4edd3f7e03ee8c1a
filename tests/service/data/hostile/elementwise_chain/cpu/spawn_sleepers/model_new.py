# Hostile: leaves 40 sleeping processes behind (they must die with the candidate's PID namespace).
import os

import torch
import torch.nn as nn

from sandbox.runtime import load_kernels

K = load_kernels()
PIDS = [os.posix_spawn("/bin/sleep", ["sleep", "100000"], dict(os.environ)) for _ in range(40)]


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        x = x.contiguous()
        out = torch.empty_like(x)
        K.elementwise_chain(x, out, x.numel())
        return out
