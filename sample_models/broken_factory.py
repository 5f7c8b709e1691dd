"""Broken on purpose, for loading errors: a factory that raises, one that returns a non-module,
and a model whose constructor computes with tensor values (fails under torch.device('meta'))."""
import torch
from torch import nn


def raises():
    raise ValueError("config key 'depth' missing")


def not_a_module():
    return {"model": "oops"}


class NeedsValues(nn.Module):
    """Constructor reads tensor values (like RegNet's width rounding)."""

    def __init__(self):
        super().__init__()
        widths = torch.tensor([8.0, 16.0]) * 1.5
        w = int(widths[1].item())  # 'Cannot copy out of meta tensor' on meta
        self.fc1 = nn.Linear(4, w)
        self.fc2 = nn.Linear(w, 2)

    def forward(self, x):
        return self.fc2(self.fc1(x).relu())


def needs_values():
    return NeedsValues()
