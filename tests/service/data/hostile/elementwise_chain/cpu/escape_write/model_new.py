# Hostile: tries to write outside its workspace (a marker in /tmp, and the node's workspace root).
import os

import torch
import torch.nn as nn

from sandbox.runtime import load_kernels

K = load_kernels()


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        fd = os.open("/tmp/cuda-agent-hostile-marker", os.O_CREAT | os.O_WRONLY, 0o644)
        os.write(fd, b"escaped")
        x = x.contiguous()
        out = torch.empty_like(x)
        K.elementwise_chain(x, out, x.numel())
        return out
