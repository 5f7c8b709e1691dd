"""Broken on purpose: weights made in forward, which no optimizer built from model.parameters() sees.

`local_tensor`: `w = torch.randn(..., requires_grad=True)` inside forward (a leaf that gets a gradient
but is not a parameter). `local_param`: `w = nn.Parameter(torch.randn(..., device=x.device))` inside
forward. `recreated`: `self.w = nn.Parameter(...)` assigned in every forward (a registered parameter,
re-initialised each call: the optimizer steps the old one). doctor: local-weight (error) for the first
two, param-recreated (error) for the third; never device-mismatch."""
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self, how: str):
        super().__init__()
        self.how = how
        self.inp = nn.Linear(20, 32)
        if how == "recreated":
            self.w = nn.Parameter(torch.randn(32, 5) * 0.1)

    def forward(self, x):
        h = torch.relu(self.inp(x))
        if self.how == "local_tensor":
            w = torch.randn(32, 5, dtype=x.dtype, device=x.device, requires_grad=True)
        elif self.how == "local_param":
            w = nn.Parameter(torch.randn(32, 5, dtype=x.dtype, device=x.device) * 0.1)
        else:
            self.w = nn.Parameter(torch.randn(32, 5, dtype=x.dtype, device=x.device) * 0.1)   # the bug
            w = self.w
        return h @ w


def local_tensor() -> nn.Module:
    return Net("local_tensor")


def local_param() -> nn.Module:
    return Net("local_param")


def recreated() -> nn.Module:
    return Net("recreated")
