"""Broken on purpose: a small CNN whose convolutional trunk is `.detach()`-ed before the head.

`build`: 12 parameter tensors; the 8 of the four convolutions get no gradient (the trunk's output is
detached), only the head's 4 train. doctor, gradflow, overfit-batch: no-grad (error) where = features."""
import torch
from torch import nn


class DetachedCNN(nn.Module):
    def __init__(self, classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(),
            nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU())
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, classes))

    def forward(self, x):
        return self.head(self.features(x).detach())     # the bug: the trunk never learns


def build() -> nn.Module:
    return DetachedCNN()


def example_inputs():
    return (torch.randn(4, 3, 16, 16),)
