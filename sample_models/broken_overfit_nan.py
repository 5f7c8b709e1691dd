"""Broken on purpose: sqrt of a linear layer's output is NaN wherever that output is negative,
so the loss is NaN from the first forward. Input: -i 16x784."""
import torch
from torch import nn


class SqrtHead(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.fc = nn.Linear(784, classes)

    def forward(self, x):
        return torch.sqrt(self.fc(x))


def build() -> nn.Module:
    return SqrtHead()


def example_inputs():
    return (torch.randn(16, 784),)
