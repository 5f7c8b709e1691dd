"""Broken on purpose: a gradient that is NaN although the forward is finite. The model appends the
length sqrt(sum h^2) of each feature vector; the batch holds a padding row of zeros, whose h is
the zero vector. sqrt(0) = 0 forward, but d sqrt/ds = inf at 0 and inf * 2h = inf * 0 = NaN,
so `proj` gets NaN gradients. gradflow: non-finite-grad where = proj."""
import torch
from torch import nn


class WithLength(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(6, 12, bias=False)
        self.head = nn.Linear(13, 3)

    def forward(self, x):
        h = self.proj(x)
        length = torch.sqrt((h * h).sum(-1, keepdim=True))
        return self.head(torch.cat([h, length], -1))


def build() -> nn.Module:
    return WithLength()


def example_inputs():
    x = torch.randn(8, 6)
    x[0] = 0.0   # a padding row
    return (x,)
