"""Torch computes the answers after forward returns (breaker pass 2 at 98bc58d).

What it tries: a gc.callbacks hook (installed at import through sys.modules['gc']) plus gc.set_threshold runs
torch.softmax in the harness phase, at the first collection after forward returns; forward only allocates and
launches a no-op kernel.
Defence: gc callbacks and thresholds are hooks, checked (and restored) after the import and after every call:
`hook`.
"""

import os

import torch
import torch.nn as nn

from sandbox.runtime import load_kernels

K = load_kernels()

# sys and sys.modules without the names the static check looks for
_sys = getattr(os, "s" + "ys")
_mods = getattr(_sys, "mod" + "ules")
_gc = _mods["gc"]
_Mon = _mods["sandbox.integrity"].Monitor
_pending = []


def _cb(phase, info):
    # garbage-collector callback: runs whenever a collection happens, in whatever phase the harness is in
    if not _pending or _Mon._instance.phase != "harness":  # harness phase: audit hook and dispatch guard are off
        return
    while _pending:
        x, out = _pending.pop()
        out.copy_(torch.softmax(x, dim=-1))


_gc.callbacks.append(_cb)
_gc.set_threshold(1, 10**9, 10**9)  # young-generation collections only: cheap, and frequent


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        out = torch.empty_like(x)
        K.touch(out, out.numel())
        _pending.append((x, out))
        return out
