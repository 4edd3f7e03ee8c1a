"""A wall-clock timer without a thread or a timer syscall (kernels/uring_sigio_handler.c, set up at import): an
io_uring TIMEOUT of 1 ms linked to a WRITE into a pipe whose read end is O_ASYNC with F_SETSIG, so SIGIO-style
delivery runs a native handler on the main thread every millisecond (the handler drains the pipe and re-arms the
pair), between timed calls and between requests. The kernel writes zeros unless the handler has fired outside
forward by the 9th call. Found by the second red-team pass on the thread filter (session 27).

Defence: the thread filter kills an rt_sigaction that installs a handler once the solution is loaded (from its import on, for the
formats the sandbox builds): the handler's install kills the process: violation "background_thread"."""
import torch
import torch.nn as nn

from sandbox.runtime import load_kernels

K = load_kernels()


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        x = x.contiguous()
        out = torch.empty_like(x)
        K.timer_chain(x, out, x.numel())
        return out
