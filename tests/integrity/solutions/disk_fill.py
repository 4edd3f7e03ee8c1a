"""Resource attack: fill the disk from inside the workspace (the jail leaves it writable).

Defence: the audit hook refuses opening files for writing from solution code: violation "file_write" (beneath it,
RLIMIT_FSIZE bounds each file).
"""
import torch
import torch.nn as nn

from sandbox.runtime import load_kernels

K = load_kernels()


class ModelNew(nn.Module):
    def forward(self, x):
        for i in range(1000):
            with open(f"fill_{i}.bin", "wb") as f:
                f.write(b"\0" * (1 << 20))
        out = torch.empty_like(x)
        K.elementwise_chain(x, out, x.numel())
        return out
