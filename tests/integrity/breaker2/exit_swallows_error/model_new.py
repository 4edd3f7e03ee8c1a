"""A try/except in disguise: a context manager whose __exit__ returns True (breaker pass 2, a lesser finding).

What it tries: the static check forbids try statements (fallbacks); a class of the solution's own with an
__exit__ that returns True swallows any exception raised in its with-block, unseen.
Defence: the static check refuses a class of model_new.py that defines __exit__ / __aexit__ (`static`: a context
manager can swallow exceptions like a try statement).
"""

import torch
import torch.nn as nn

from sandbox.runtime import load_kernels

K = load_kernels()


class _Quiet:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return True


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        x = x.contiguous()
        out = torch.empty_like(x)
        cols = x.shape[-1]
        K.row_softmax(x, out, x.numel() // cols, cols)
        with _Quiet():
            1 / 0
        return out
