"""A 3-layer MLP: 784 → 256 → 128 → 10. Input: -i 16x784."""
from torch import nn


def build(hidden: int = 256, classes: int = 10) -> nn.Module:
    return nn.Sequential(
        nn.Linear(784, hidden), nn.ReLU(),
        nn.Linear(hidden, 128), nn.ReLU(),
        nn.Linear(128, classes),
    )


def example_inputs():
    import torch

    return (torch.randn(16, 784),)
