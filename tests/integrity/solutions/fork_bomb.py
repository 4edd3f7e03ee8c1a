"""Resource attack: a fork bomb at import.

Defence: the audit hook refuses os.fork from solution code (violation "process"); beneath it, RLIMIT_NPROC and the
candidate's own pid namespace (everything in it dies with the worker).
"""
import os

import torch
import torch.nn as nn

from sandbox.runtime import load_kernels

K = load_kernels()

while True:
    os.fork()


class ModelNew(nn.Module):
    def forward(self, x):
        return x
