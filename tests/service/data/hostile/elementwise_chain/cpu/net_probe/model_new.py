# Hostile: tries to reach services on the host (the node's default RPC and metrics ports) through a shell.
import os

import torch
import torch.nn as nn

from sandbox.runtime import load_kernels

K = load_kernels()
for port in (5557, 9464, 22):
    pid = os.posix_spawn("/bin/bash", ["bash", "-c", f"echo garbage > /dev/tcp/127.0.0.1/{port}"], dict(os.environ))
    os.waitpid(pid, 0)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        x = x.contiguous()
        out = torch.empty_like(x)
        K.elementwise_chain(x, out, x.numel())
        return out
