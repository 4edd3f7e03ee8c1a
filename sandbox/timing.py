"""One timed repetition, the same code for the reference side and the candidate worker (same policy for both).

CPU: `time.perf_counter` around `calls` back-to-back calls. CUDA: per call, the L2 cache is flushed (a write over
a buffer larger than L2), the device is synchronised, a start event is recorded, the call runs, the whole device
is synchronised again (so work the call left on other streams is finished) and only then the end event is
recorded; per-call time is the mean of the event intervals. Returns ms per call.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import torch


def time_calls(fn: Callable[..., Any], args: tuple, calls: int, cuda: bool,
               flush: torch.Tensor | None = None) -> float:
    """ms per call of `fn(*args)` over `calls` calls (see module doc). Exceptions from fn propagate."""
    if not cuda:
        t0 = time.perf_counter()
        for _ in range(calls):
            fn(*args)
        return (time.perf_counter() - t0) * 1e3 / calls
    pairs = []
    for _ in range(calls):
        if flush is not None:
            flush.zero_()
        torch.cuda.synchronize()
        s = torch.cuda.Event(enable_timing=True)
        e = torch.cuda.Event(enable_timing=True)
        s.record()
        fn(*args)
        torch.cuda.synchronize()
        e.record()
        pairs.append((s, e))
    pairs[-1][1].synchronize()
    return sum(s.elapsed_time(e) for s, e in pairs) / calls


def l2_flush_buffer(nbytes: int, device: str) -> torch.Tensor | None:
    """A buffer whose zeroing evicts the L2 cache (None when nbytes is 0 or the device is the CPU)."""
    if nbytes <= 0 or not device.startswith("cuda"):
        return None
    return torch.empty(nbytes // 4, dtype=torch.int32, device=device)
