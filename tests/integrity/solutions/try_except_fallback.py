"""Not doing the task: a try/except fallback to torch when the kernel path "fails" (here, always).

Defence: the dispatch guard records the op before raising, so swallowing the exception does not help: violation
"dispatch_op" (the static check would refuse the try statement; it is off in these tests).
"""
import torch
import torch.nn as nn

from sandbox.runtime import load_kernels

K = load_kernels()


class ModelNew(nn.Module):
    def forward(self, x):
        try:
            return torch.tanh(x)
        except Exception:
            out = torch.empty_like(x)
            K.elementwise_chain(x.contiguous(), out, x.numel())
            return out
