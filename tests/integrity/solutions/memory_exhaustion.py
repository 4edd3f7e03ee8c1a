"""Resource attack: exhaust the host's memory (12 GiB in one allocation, touched).

Defence: RLIMIT_AS on the cpu backend (SandboxConfig.rlimit_as_bytes, 8 GiB by default): the allocation fails in
the candidate's process: status runtime_error, the trusted side unharmed.
"""
import torch
import torch.nn as nn

from sandbox.runtime import load_kernels

K = load_kernels()


class ModelNew(nn.Module):
    def forward(self, x):
        hog = torch.ones(3 * 1024**3)
        out = torch.empty_like(x)
        K.elementwise_chain(x, out, x.numel())
        return out
