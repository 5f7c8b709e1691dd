"""Broken on purpose: vanishing gradients. 16 sigmoid layers with small weights (std 0.5/sqrt(fan_in))
and no residuals: each layer multiplies the backward signal by ~sigmoid'(x) * 0.5 ≈ 0.125, so
the first layers get gradients ~1e-14 times the last ones'. gradflow: vanishing-grad (warning)
on the first layers; exit 0, exit 1 with --strict."""
import math

import torch
from torch import nn


def build(depth: int = 16, width: int = 32) -> nn.Module:
    torch.manual_seed(0)
    layers = []
    for i in range(depth):
        lin = nn.Linear(16 if i == 0 else width, width)
        with torch.no_grad():
            lin.weight.normal_(0.0, 0.5 / math.sqrt(lin.in_features))
        layers += [lin, nn.Sigmoid()]
    layers.append(nn.Linear(width, 4))
    return nn.Sequential(*layers)


def example_inputs():
    return (torch.randn(8, 16),)
