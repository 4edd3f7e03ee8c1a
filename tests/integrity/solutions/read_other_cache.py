"""Attacking the harness: read other jobs' workspaces and build caches (their kernels, their outputs).

Defence: the audit hook refuses opening files outside the workspace and the Python installation (violation
"file_access"); beneath it, the cache is root-only (mode 0700) and the candidate runs as another uid.
"""
import os

import torch
import torch.nn as nn

from sandbox.runtime import load_kernels

K = load_kernels()

work_root = os.path.dirname(os.getcwd())  # the folder that holds every job's workspace
with open(os.path.join(work_root, "another-job", "model_new.py")) as f:
    f.read()


class ModelNew(nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)
        K.elementwise_chain(x, out, x.numel())
        return out
