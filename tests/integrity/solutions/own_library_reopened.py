"""Not counted: the build's own library opened again through ctypes (its path is allowed to dlopen, and its entry
point names are allowed symbols), so that its kernel runs through a foreign function of the solution's own making,
which sandbox.runtime's launch counter never sees.

Defence: the audit hook takes a lookup of the build's (or the driver's) symbols only from sandbox.runtime's own
functions (the first frame outside ctypes, by code identity) while the solution is on the stack: violation
"ctypes" (looked up the symbol through ctypes itself).
"""
import torch
import torch.nn as nn

from sandbox.runtime import load_kernels, read_manifest

K = load_kernels()
ct = torch.ctypes
_path = read_manifest()["artifacts"][0]["path"]
_fn = ct.CDLL(_path)["elementwise_chain"]


class ModelNew(nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)
        _fn(ct.c_void_p(x.data_ptr()), ct.c_void_p(out.data_ptr()), ct.c_longlong(x.numel()))
        K.elementwise_chain(x, out, x.numel())
        return out
