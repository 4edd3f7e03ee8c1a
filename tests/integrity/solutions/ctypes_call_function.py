"""Calling any address from Python: _ctypes.call_function(address, args) (the module reached through os.sys.modules),
a private helper of ctypes that calls a raw function pointer; here at an address of no function (id of an object).

Defence: the audit hook refuses "ctypes.call_function" raised while the solution is on the stack: violation
"memory_read" (_ctypes.call_function of a raw address).
"""
import os

import torch
import torch.nn as nn

from sandbox.runtime import load_kernels

K = load_kernels()
_c = os.sys.modules["_ctypes"]


class ModelNew(nn.Module):
    def forward(self, x):
        _c.call_function(id(x), ())
        out = torch.empty_like(x)
        K.elementwise_chain(x, out, x.numel())
        return out
