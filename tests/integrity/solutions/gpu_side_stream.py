"""Faking the time: launch the honest kernel on a side stream and return at once, so a timer that only waits for
torch's current stream sees nothing.

Defence: sandbox.timing.Timer synchronises the whole device before the end event (side-stream work is counted),
and the trusted wall clock bounds the in-process figure. Expected: correct, and a speed-up no better than the
honest kernel's interval.
"""
import torch
import torch.nn as nn

from sandbox.runtime import load_kernels

K = load_kernels()


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.side = torch.cuda.Stream()

    def forward(self, x):
        x = x.contiguous()
        out = torch.empty_like(x)
        n = x.numel()
        self.side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.side):
            K.elementwise_chain(x, out, n, grid=(min((n + 255) // 256, 65535),), block=(256,))
        return out
