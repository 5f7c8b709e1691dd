"""Broken on purpose: `noise` always calls F.dropout(..., training=True), so eval outputs change
from run to run. doctor names `noise` (nondeterministic-eval); `drop` is a proper nn.Dropout."""
import torch
import torch.nn.functional as F
from torch import nn


class AlwaysDropout(nn.Module):
    def forward(self, x):
        return F.dropout(x, 0.2, training=True)   # BUG: should be training=self.training


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 32)
        self.drop = nn.Dropout(0.1)
        self.noise = AlwaysDropout()
        self.head = nn.Linear(32, 4)

    def forward(self, x):
        return self.head(self.noise(self.drop(torch.relu(self.fc(x)))))


def build() -> nn.Module:
    return Net()


def example_inputs():
    return (torch.randn(8, 16),)
