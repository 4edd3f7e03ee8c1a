"""Faking the time (CPU analogue of a side stream): return a freshly allocated output at once and let a background
thread run the kernel, so the timed call ends before the work does.

Defence: thread starts from solution code are refused (sandbox.integrity.install_thread_guard): violation "thread".
"""
import os

import torch
import torch.nn as nn

from sandbox.runtime import load_kernels

K = load_kernels()

threading = os.sys.modules["threading"]


class ModelNew(nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)
        threading.Thread(target=K.elementwise_chain, args=(x, out, x.numel())).start()
        return out
