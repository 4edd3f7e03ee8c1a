"""Faking the time: the same background work, started with the low-level _thread module (no threading.Thread).

Defence: _thread.start_new_thread is replaced by the thread guard too: violation "thread".
"""
import os

import torch
import torch.nn as nn

from sandbox.runtime import load_kernels

K = load_kernels()

_thread = os.sys.modules["_thread"]


class ModelNew(nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)
        _thread.start_new_thread(K.elementwise_chain, (x, out, x.numel()))
        return out
