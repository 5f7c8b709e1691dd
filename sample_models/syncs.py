"""An MLP with exactly two deliberate host syncs in its forward, for `torchdiag profile --syncs`:
an `.item()` (a Python float from a tensor) and a boolean-mask index (an output whose size depends on
the values), each marked by a comment naming it; nothing else in it makes the host wait. Input: -i 16x32."""
import torch
from torch import nn


class Syncy(nn.Module):
    def __init__(self, features: int = 32, classes: int = 4):
        super().__init__()
        self.fc1 = nn.Linear(features, 64)
        self.fc2 = nn.Linear(64, classes)

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        peak = h.amax().item()  # host sync: .item()
        h = h / (1.0 + peak)
        active = h[h > 0]  # host sync: boolean-mask indexing
        h = h - active.sum() / h.numel()
        return self.fc2(h)


def build(features: int = 32, classes: int = 4) -> nn.Module:
    return Syncy(features, classes)


def example_inputs():
    return (torch.randn(16, 32),)
