"""The import hook's non-statement rule looks only at getframe(2), the immediate caller of builtins.__import__:
`functools.singledispatch(__import__)("numpy")` makes functools' wrapper the caller, so numpy (not on the
allow-list) is imported. (`__import__` passed as a value is not a *call* of __import__ for the static check.)
Tensor.numpy / torch.from_numpy are reached the same way (direct guards: immediate caller only). NumPy computes.

Defence: the import is not what is refused (torch has numpy in sys.modules anyway): the bridges it then calls
through functools are direct guards, which attribute a call routed through the standard library to the first
other frame, the solution: violation "numpy_bridge".
"""
import functools
import torch
import torch.nn as nn

from sandbox.runtime import load_kernels

K = load_kernels()
_imp = functools.singledispatch(__import__)
np = _imp("numpy")
_imp("numpy._core._methods")  # numpy imports it lazily from C on the first .max(): do it now, through functools
_to_np = functools.singledispatch(torch.Tensor.numpy)
_from_np = functools.singledispatch(torch.from_numpy)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        x = x.contiguous()
        out = torch.empty_like(x)
        K.touch(out, 0)
        a = _to_np(x)
        e = np.exp(a - np.maximum.reduce(a, axis=-1, keepdims=True))  # ufunc methods: no lazy import from C
        e /= np.add.reduce(e, axis=-1, keepdims=True)
        out.copy_(_from_np(e))
        return out
