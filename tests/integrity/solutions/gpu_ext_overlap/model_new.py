"""CUDA, extension format (timed ungated, its default): a correct, compute-heavy elementwise_chain whose C++ side
runs a helper thread of its own (std::thread: the extension format's native code has no symbol allow-list, and no
Python thread exists). After each call returns, the helper computes the next timed call's output on a stream of its
own, from the input the call guessed (the next block of the caching allocator: the harness stages a repetition's
sets one after the other before the first call), while the harness copies and checks the outputs and flushes L2 for
the next call; that call only copies the result. The work runs where neither the in-process clock (between calls)
nor the trusted wall clock (it overlaps the harness's own per-call cost, which calibration subtracts) sees it.

Defence: the thread filter (sandbox.thread_filter, SandboxConfig.thread_filter_cuda, on by default): it is on from
the import of a solution the sandbox built, and the helper's start in the first forward kills the candidate's
process (SIGSYS): violation "background_thread". Without the filter the hole is open (a check would have to see GPU
work between calls)."""
import torch
import torch.nn as nn

from sandbox.runtime import load_extension

ext = load_extension()


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return ext.forward(x)
