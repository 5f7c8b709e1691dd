"""Broken on purpose: the model ends in a softmax and cross-entropy is applied to it, the classic
"softmax twice" bug. Every logit the loss sees lies in [0, 1], so with 10 classes cross-entropy
cannot go below log(1 + 9/e) ≈ 1.461, far above 1% of its initial value. Input: -i 16x784."""
import torch
from torch import nn


def build(hidden: int = 64, classes: int = 10) -> nn.Module:
    return nn.Sequential(nn.Linear(784, hidden), nn.ReLU(), nn.Linear(hidden, classes), nn.Softmax(dim=1))


def example_inputs():
    return (torch.randn(16, 784),)
