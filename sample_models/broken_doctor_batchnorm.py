"""Broken on purpose: BatchNorm1d on (N, C) features trained with batches of 1 — train mode raises
("Expected more than 1 value per channel"). doctor names `bn` (batchnorm-batch-1)."""
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(20, 32)
        self.bn = nn.BatchNorm1d(32)
        self.head = nn.Linear(32, 3)

    def forward(self, x):
        return self.head(torch.relu(self.bn(self.fc(x))))


def build() -> nn.Module:
    return Net()


def example_inputs():
    return (torch.randn(1, 20),)   # one sample per step (e.g. online learning)
