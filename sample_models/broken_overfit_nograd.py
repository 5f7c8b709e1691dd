"""Broken on purpose: the body runs under torch.no_grad(), so its parameters never get a gradient;
only `bias` (one logit offset per class, shared by all samples) learns, which cannot memorise
random labels. Input: -i 16x784."""
import torch
from torch import nn


class FrozenByMistake(nn.Module):
    def __init__(self, hidden=64, classes=10):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(784, hidden), nn.ReLU(), nn.Linear(hidden, classes))
        self.bias = nn.Parameter(torch.zeros(classes))

    def forward(self, x):
        with torch.no_grad():          # the bug: the body is cut off from autograd
            h = self.body(x)
        return h + self.bias


def build() -> nn.Module:
    return FrozenByMistake()


def example_inputs():
    return (torch.randn(16, 784),)
