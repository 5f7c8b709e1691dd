"""Broken on purpose: a zero gradient. The encoder's output is quantised with torch.round before
the head; round has derivative 0 everywhere, so every encoder parameter gets an all-zero
gradient (no straight-through estimator). gradflow: zero-grad where = encoder."""
import torch
from torch import nn


class Quantised(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(8, 16), nn.Tanh())
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        return self.head(torch.round(self.encoder(x) * 4) / 4)


def build() -> nn.Module:
    return Quantised()


def example_inputs():
    return (torch.randn(8, 8),)
