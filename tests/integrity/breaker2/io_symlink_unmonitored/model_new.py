"""The .io escape with the in-process monitor off: what the operating system and the trusted side hold on their own.

What it tries (run with runtime_monitor=False, static checks off): at import it finds its spill folder (the
workspace's .io, and the folder the Worker names, read from the frames), renames it and puts a symlink to a
directory outside the sandbox (VICTIM_DIR, filled in by the test) in its place; the trusted worker then spills
the run requests' 1 MiB input tensors, as root, into whatever the path names.
Defence: the trusted side opened the spill folder as a directory fd before the candidate existed and creates and
reads files only relative to it (O_NOFOLLOW, fstat checks), so nothing lands in VICTIM_DIR; the folder lies in
the root-owned workspaces folder, so as the sandbox uid the rename itself fails.
"""

import os
import sys

import torch
import torch.nn as nn

from sandbox.runtime import load_kernels

K = load_kernels()
VICTIM_DIR = "@VICTIM_DIR@"


def _spill_dirs():
    out = [os.path.abspath(".io")]
    f = sys._getframe()
    while f is not None:
        w = f.f_locals.get("self")
        p = getattr(w, "io", None) if w is not None else None
        p = getattr(p, "path", p)
        if isinstance(p, str):
            out.append(p)
        f = f.f_back
    return list(dict.fromkeys(out))


TRIED = []
for d in _spill_dirs():
    try:
        os.rename(d, d + "_moved")
        os.symlink(VICTIM_DIR, d)
        TRIED.append(f"{d}: swapped")
    except OSError as e:
        TRIED.append(f"{d}: {e}")


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        x = x.contiguous()
        out = torch.empty_like(x)
        cols = x.shape[-1]
        K.row_softmax(x, out, x.numel() // cols, cols)
        return out
