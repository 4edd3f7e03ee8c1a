"""Resource attack: leave a process behind that outlives the evaluation (fork, setsid, sleep).

Defence: the audit hook refuses os.fork (violation "process"); beneath it, the pid namespace and the process-group
kill of the worker's tree.
"""
import os

import torch
import torch.nn as nn

from sandbox.runtime import load_kernels

K = load_kernels()

if os.fork() == 0:
    os.setsid()
    os.sys.modules["time"].sleep(3600)


class ModelNew(nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)
        K.elementwise_chain(x, out, x.numel())
        return out
