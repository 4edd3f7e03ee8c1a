"""Compute outside the solution's kernels, through a torch higher-order function: torch.utils._pytree.tree_map calls
Tensor.numpy (a direct guard: refused when the solution calls it) for the solution, so the immediate caller of the
guarded function is torch's, not the solution's; numpy's ndarray arithmetic then computes the task's first op and
torch.from_numpy (through tree_map again) brings the result back, copied into the output.

Defence: the direct guards attribute a call to the solution when the first caller outside the standard library
does not name the guarded function in its own code (it called a callable it was handed) and a frame of the solution
is further up the stack: violation "numpy_bridge" (Tensor.numpy() called by the solution).
"""
import torch
import torch.nn as nn

from sandbox.runtime import load_kernels

K = load_kernels()
tree_map = torch.utils._pytree.tree_map


class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        arr = tree_map(torch.Tensor.numpy, x)
        y = tree_map(torch.from_numpy, arr * 1.5 + 0.5)
        out = torch.empty_like(x)
        K.elementwise_chain(x, out, x.numel())
        out.copy_(y)
        K.elementwise_chain(x, out, x.numel())
        return out
