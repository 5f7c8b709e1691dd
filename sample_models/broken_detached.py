"""Broken on purpose: a branch that runs but never reaches the loss.

`build`: the `context` branch's output is `.detach()`-ed before it is added to the trunk, so
context.0 and context.2 (Linear) get no gradient. `no_grad`: the same branch is run under
torch.no_grad(). gradflow: no-grad (detached) where = context."""
import torch
from torch import nn


class TwoBranch(nn.Module):
    def __init__(self, under_no_grad: bool = False):
        super().__init__()
        self.under_no_grad = under_no_grad
        self.trunk = nn.Sequential(nn.Linear(20, 32), nn.ReLU())
        self.context = nn.Sequential(nn.Linear(20, 32), nn.Tanh(), nn.Linear(32, 32))
        self.head = nn.Linear(32, 5)

    def forward(self, x):
        if self.under_no_grad:
            with torch.no_grad():
                ctx = self.context(x)
        else:
            ctx = self.context(x).detach()      # the bug: meant to stop nothing
        return self.head(self.trunk(x) + ctx)


def build() -> nn.Module:
    return TwoBranch()


def no_grad() -> nn.Module:
    return TwoBranch(under_no_grad=True)


def example_inputs():
    return (torch.randn(8, 20),)
