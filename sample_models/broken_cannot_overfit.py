"""Broken on purpose: cannot memorise a batch. `BatchMean` replaces every sample's logits by the
mean over the batch (dim 0), so all samples get the same prediction; with random class targets
the cross-entropy cannot go below the entropy of the batch's labels. Input: -i 16x784."""
import torch
from torch import nn


class BatchMean(nn.Module):
    """Averages over the batch dimension: every sample's output is the batch mean."""

    def forward(self, x):
        return x.mean(dim=0, keepdim=True).expand_as(x)


def build(hidden: int = 64, classes: int = 10) -> nn.Module:
    return nn.Sequential(
        nn.Linear(784, hidden), nn.ReLU(),
        nn.Linear(hidden, classes),
        BatchMean(),
    )


def example_inputs():
    return (torch.randn(16, 784),)
