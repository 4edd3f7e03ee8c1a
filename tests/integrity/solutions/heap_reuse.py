"""Taking the answer (CPU analogue of allocator reuse): compute honestly for the first calls, then launch a kernel
that does no work and return torch.empty_like(x), hoping the allocator hands back the previous output's block.

Defence: fresh inputs per timed call, every timed call's outputs checked (positions chosen after the call, one
call in full), freed outputs scrubbed: violation "timed_output_mismatch".
"""
import torch
import torch.nn as nn

from sandbox.runtime import load_kernels

K = load_kernels()


CALLS = [0]  # module level: survives the harness re-creating ModelNew for other shapes


class ModelNew(nn.Module):
    def forward(self, x):
        CALLS[0] += 1
        out = torch.empty_like(x)
        K.elementwise_chain(x, out, x.numel() if CALLS[0] <= 8 else 0)
        return out
