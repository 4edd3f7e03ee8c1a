"""Attacking the harness: exit the process with status 0 in the middle of verification, hoping a clean exit reads
as success.

Defence: results come only from replies to requests (a worker that exits, whatever its status, is a crash):
status runtime_error with the exit reported.
"""
import os

import torch
import torch.nn as nn

from sandbox.runtime import load_kernels

K = load_kernels()


class ModelNew(nn.Module):
    def forward(self, x):
        os._exit(0)
