"""Broken on purpose: `shift` adds its bias in place (x += b) to the Sigmoid output, which autograd
saved for backward — backward fails. doctor names `shift` (inplace-autograd)."""
import torch
from torch import nn


class InplaceShift(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x):
        x += self.bias          # BUG: edits the Sigmoid output that SigmoidBackward needs
        return x


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 32)
        self.act = nn.Sigmoid()
        self.shift = InplaceShift(32)
        self.out = nn.Linear(32, 4)

    def forward(self, x):
        return self.out(self.shift(self.act(self.fc(x))))


def build() -> nn.Module:
    return Net()


def example_inputs():
    return (torch.randn(8, 16),)
