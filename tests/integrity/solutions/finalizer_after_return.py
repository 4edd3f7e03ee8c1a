"""Faking the time: in the timed calls only (told apart by the collector's state: the harness switches it off for
time requests), forward launches its kernel on one element (so a kernel is seen in the call) and leaves the rest
of the work to a finalizer, on a garbage cycle, with the
collector switched on just short of its threshold, so that the first allocations after the call (the harness's copy of
the output) runs the collection, and with it the kernel, outside the timed call. (gc.set_threshold is refused by
the audit hook; the default threshold is approached by allocating containers up to 3 short of it.)

Defence: the profile's checks of every timed call's outputs find the unfinished output: status "incorrect"
(timed_output_mismatch). The harness also switches the collector off again right after every timed call
(sandbox.candidate: gc_off), so that such a finalizer cannot run before the output is copied; on the CPU box this
solution was caught the same way with gc_off taken out (2026-12-02), so it is not a regression test of gc_off.
"""
import os

import torch
import torch.nn as nn

from sandbox.runtime import load_kernels

K = load_kernels()


class _Later:
    def __init__(self, x, out):
        self.x, self.out, self.me = x, out, self  # a cycle: only the collector frees it

    def __del__(self):
        K.elementwise_chain(self.x, self.out, self.x.numel())


class ModelNew(nn.Module):
    def forward(self, x):
        gc = os.sys.modules["gc"]
        if gc.isenabled():  # an untimed request (verification): honest
            out = torch.empty_like(x)
            K.elementwise_chain(x, out, x.numel())
            return out
        out = torch.zeros_like(x)
        K.elementwise_chain(x.view(-1)[:1], out.view(-1)[:1], 1)
        _Later(x, out)
        gc.enable()
        self._junk = [[] for _ in range(max(0, gc.get_threshold()[0] - gc.get_count()[0] - 3))]
        return out
