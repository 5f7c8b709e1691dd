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


def deep(depth: int = 4, width: int = 16, classes: int = 4) -> nn.Module:
    """`depth` Linear+ReLU layers of `width` (input: N x width): the same model at any depth, to show a
    cost does (or does not) grow with it (bench/bench_syncs.py, tests/test_syncs.py)."""
    layers = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, classes))
