"""Broken on purpose: exploding initialisation. An 8-layer ReLU MLP whose weights are drawn with
std 6/sqrt(fan_in) (He init is sqrt(2)/sqrt(fan_in)): activations grow ~4.2x per layer, the logits
reach ~1e5 and the gradients of every weight explode. gradflow: exploding-grad on layers.*."""
import math

import torch
from torch import nn


class DeepMLP(nn.Module):
    def __init__(self, width: int = 64, depth: int = 8, classes: int = 10, gain: float = 6.0):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(32 if i == 0 else width, width) for i in range(depth))
        self.act = nn.ReLU()
        self.head = nn.Linear(width, classes)
        with torch.no_grad():
            for lin in self.layers:
                lin.weight.normal_(0.0, gain / math.sqrt(lin.in_features))
                lin.bias.zero_()

    def forward(self, x):
        for lin in self.layers:
            x = self.act(lin(x))
        return self.head(x)


def build(gain: float = 6.0) -> nn.Module:
    torch.manual_seed(0)
    return DeepMLP(gain=gain)


def example_inputs():
    return (torch.randn(16, 32),)
