"""Not doing the task with kernels: the launcher's foreign function is swapped for a Python function (the kernel
object's `_fn`), so that `K.<name>(...)` goes through the launcher, as a counted launch would, while no kernel runs;
whatever the output holds then would have been computed elsewhere (here nothing is: only the launch evidence matters).

Defence: the monitor counts a cpu kernel's launch where the kernel's own foreign function, which it keeps, is
called (not where the launcher counts itself), so a launch through a swapped function counts nothing: violation
"no_kernel_launched".
"""
import torch
import torch.nn as nn

from sandbox.runtime import load_kernels

K = load_kernels()


def _nothing(*args):
    return None


class ModelNew(nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)
        K.elementwise_chain._fn = _nothing
        K.elementwise_chain(x, out, x.numel())
        return out
