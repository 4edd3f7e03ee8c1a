"""Attacking the host: open a network connection (to fetch an answer or leak a seed).

Defence: the audit hook refuses sockets from solution code (violation "network"); beneath it, the candidate's own
network namespace.
"""
import os

import torch
import torch.nn as nn

from sandbox.runtime import load_kernels

K = load_kernels()

socket = os.sys.modules["socket"]
socket.create_connection(("127.0.0.1", 9), timeout=1)


class ModelNew(nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)
        K.elementwise_chain(x, out, x.numel())
        return out
