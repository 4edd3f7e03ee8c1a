"""Faking the time: return a tensor subclass that computes its values only when someone reads them (after the
timed region).

Defence: outputs must be plain torch.Tensor objects: violation "lazy_output".
"""
import torch
import torch.nn as nn

from sandbox.runtime import load_kernels

K = load_kernels()


class Lazy(torch.Tensor):
    pass


class ModelNew(nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)
        K.elementwise_chain(x, out, x.numel())
        return out.as_subclass(Lazy)
