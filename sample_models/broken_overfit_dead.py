"""Broken on purpose: a ReLU shifted far below zero is dead for every input, so the output is
all zeros, every gradient is exactly zero and the loss stays at ln(classes) (uniform logits).
Input: -i 16x784."""
import torch
from torch import nn


class Shift(nn.Module):
    def __init__(self, by: float):
        super().__init__()
        self.by = by

    def forward(self, x):
        return x + self.by


def build(classes: int = 10) -> nn.Module:
    return nn.Sequential(nn.Linear(784, 64), Shift(-1e4), nn.ReLU(), nn.Linear(64, classes, bias=False))


def example_inputs():
    return (torch.randn(16, 784),)
