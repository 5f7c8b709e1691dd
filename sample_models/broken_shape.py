"""Broken on purpose: the second Linear expects 64 features but receives 32 (exit 3 in forward)."""
from torch import nn


def build() -> nn.Module:
    return nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Sequential(nn.Linear(64, 8)))


def example_inputs():
    import torch

    return (torch.randn(4, 10),)
