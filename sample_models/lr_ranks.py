"""Models for lr-find under torchrun (tests/test_lr_find.py launches `torchdiag lr-find` on 2 gloo ranks), built the same on every
rank (the factory is seeded); what differs by rank comes from torchrun's RANK variable, read in forward.

`healthy`: an MLP; every rank runs the same schedule.
`fails_later`: forward raises on rank 1 from its 6th call on (in the middle of the first range test):
   its peer must stop with it, not wait in its next collective.
Input for all: example_inputs(), 8 × 8."""
import os

import torch
from torch import nn


class _Later(nn.Module):
    def __init__(self, after: int):
        super().__init__()
        self.after, self.calls = after, 0
        self.body = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))

    def forward(self, x):
        self.calls += 1
        if int(os.environ.get("RANK", "0")) == 1 and self.calls > self.after:
            raise RuntimeError("this model fails on rank 1 after a few calls")
        return self.body(x)


def healthy() -> nn.Module:
    torch.manual_seed(0)
    return _Later(10 ** 9)


def fails_later() -> nn.Module:
    torch.manual_seed(0)
    return _Later(5)


def example_inputs():
    return torch.randn(8, 8, generator=torch.Generator().manual_seed(1))
