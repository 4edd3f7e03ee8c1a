"""Faking the time: replay the honest kernel as a CUDA graph on a side stream. A graph's replay is neither a launch
of the launcher's (counted per stream) nor a torch op (which the dispatch guard sees under another stream), so a
harness that knew only those would time the call behind the gate as held-stream work: the events bracket nothing
(one empty launch on the held stream keeps the launch count above zero) and only the host's release-to-synchronised
time, less the gate latency it forgives, would count the graph's work.

Graphs are captured per (input, output) address pair, during verification and the warm-up (the caching allocator
hands the timed calls the same addresses again); a capture's launch on the side stream is counted, a replay alone
would not have been.

Defence: sandbox.integrity wraps torch._C._CUDAGraph.replay and counts each replay on the stream it goes to
(install_torch_wrappers, Monitor.launch_streams), so a gated call that replays a graph on another stream counts its
whole wall clock (sandbox.timing.Timer.side_work). Expected: correct, and a speed-up no better than the honest
kernel's interval.
"""
import torch
import torch.nn as nn

from sandbox.runtime import load_kernels

K = load_kernels()


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.side = torch.cuda.Stream()
        self.graphs = {}

    def forward(self, x):
        x = x.contiguous()
        out = torch.empty_like(x)
        n = x.numel()
        cur = torch.cuda.current_stream()
        key = (x.data_ptr(), out.data_ptr(), n)
        # a counted launch on the held stream that does no work (and loads the kernel before any capture)
        K.elementwise_chain(x, out, 0, grid=(1,), block=(32,))
        g = self.graphs.get(key)
        if g is None:
            g = torch.cuda.CUDAGraph()
            self.side.wait_stream(cur)
            with torch.cuda.stream(self.side):
                g.capture_begin(capture_error_mode="relaxed")
                K.elementwise_chain(x, out, n, grid=(min((n + 255) // 256, 65535),), block=(256,))
                g.capture_end()
            self.graphs[key] = g
        self.side.wait_stream(cur)
        with torch.cuda.stream(self.side):
            g.replay()
        return out
