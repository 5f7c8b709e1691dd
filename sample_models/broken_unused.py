"""Broken on purpose: parameters that never take part in forward.

`build`: an `aux_head` submodule is constructed but forward never calls it (a leftover, or an
auxiliary head only used by a training script). `param`: a module that runs but never uses
its own `scale` parameter. gradflow: no-grad (unused) where = aux_head / block.scale."""
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.fc = nn.Linear(dim, dim)
        self.scale = nn.Parameter(torch.ones(dim))   # the bug: forgotten in forward

    def forward(self, x):
        return torch.relu(self.fc(x))


class WithAuxHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(16, 32), nn.ReLU())
        self.block = Block(32)
        self.head = nn.Linear(32, 4)
        self.aux_head = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 2))

    def forward(self, x):
        return self.head(self.block(self.encoder(x)))


def build() -> nn.Module:
    return WithAuxHead()


def example_inputs():
    return (torch.randn(8, 16),)
