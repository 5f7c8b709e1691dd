"""Broken on purpose: NaN only in backward. `norm` computes an L2 norm as sqrt(sum(x²)); row 0
of the example batch is all zeros, so the forward is finite (sqrt(0) = 0) but the gradient of
sqrt at 0 is Inf, and Inf·0 gives NaN in the gradient w.r.t. norm's input — and so in
proj.weight's gradient. `head` gets finite gradients.

    torchdiag nancheck sample_models/broken_nan_backward.py:build    # culprit: norm (L2Norm), backward
"""
import torch
from torch import nn


class L2Norm(nn.Module):
    def forward(self, x):
        return torch.sqrt((x ** 2).sum(dim=-1, keepdim=True))   # no eps


class NanBackward(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8, bias=False)
        self.norm = L2Norm()
        self.head = nn.Linear(1, 3)

    def forward(self, x):
        return self.head(self.norm(self.proj(x)))


def build() -> nn.Module:
    torch.manual_seed(0)
    return NanBackward()


def example_inputs():
    x = torch.randn(4, 8)
    x[0] = 0.0
    return (x,)
