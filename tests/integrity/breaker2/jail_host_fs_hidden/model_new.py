"""What the candidate can see of the host's file system (breaker pass 2's jail_probe, a lesser finding).

What it tries (run with runtime_monitor=False, so only the operating system is in the way): forward looks for a
marker folder the test made outside the sandbox (MARKER, under /tmp, filled in by the test) and for the other
worktrees beside the repository, and raises when it can see them (at 98bc58d the whole host file system was
visible read-only: /work, /tmp, ...).
Defence: sandbox.jail covers the host's scratch and home folders (/tmp, /var/tmp, /home, /root, /work, ...) with
an empty tmpfs in the candidate's mount namespace and binds back only what the interpreter, the repository and
the evaluation need: the evaluation is `ok`.
"""

import os

import torch
import torch.nn as nn

from sandbox.runtime import load_kernels

K = load_kernels()
MARKER = "@MARKER@"
REPO = "@REPO@"


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        seen = [MARKER] if os.path.exists(MARKER) else []
        parent = os.path.dirname(REPO)
        seen += [os.path.join(parent, n) for n in os.listdir(parent) if os.path.join(parent, n) != REPO]
        if seen:
            raise RuntimeError(f"host paths visible to the candidate: {seen[:5]}")
        x = x.contiguous()
        out = torch.empty_like(x)
        cols = x.shape[-1]
        K.row_softmax(x, out, x.numel() // cols, cols)
        return out
