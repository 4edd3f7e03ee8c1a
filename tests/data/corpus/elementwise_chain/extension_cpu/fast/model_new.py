import torch
import torch.nn as nn

from sandbox.runtime import load_extension

ext = load_extension()


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return ext.forward(x)
