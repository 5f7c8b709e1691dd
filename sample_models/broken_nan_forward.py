"""Broken on purpose: NaN in forward. `log_features` takes log() of tanh outputs, which are
negative for about half the units, so it emits NaN from finite inputs; `head` carries it on.

    torchdiag nancheck sample_models/broken_nan_forward.py:build     # culprit: log_features (LogFeatures)
"""
import torch
from torch import nn


class LogFeatures(nn.Module):
    """log-compress features — forgets that its input can be negative."""

    def forward(self, x):
        return torch.log(x)


class NanForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(16, 32), nn.Tanh())
        self.log_features = LogFeatures()
        self.head = nn.Linear(32, 4)

    def forward(self, x):
        return self.head(self.log_features(self.encoder(x)))


def build() -> nn.Module:
    torch.manual_seed(0)
    return NanForward()


def example_inputs():
    return (torch.randn(8, 16),)
