"""Broken on purpose: two parameters get a gradient but never change.
- `gate.scale`: forward writes 1.0 into it (`.data.fill_`), undoing every optimizer step.
- `head.bias`: a gradient hook multiplies its gradient by 0.
doctor names both (param-not-updated)."""
import torch
from torch import nn


class Gate(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        self.scale.data.fill_(1.0)      # BUG: "re-initialises" the parameter on every call
        return x * self.scale


def build() -> nn.Module:
    model = Net()
    model.head.bias.register_hook(lambda g: g * 0)   # BUG: a leftover gradient mask
    return model


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 32)
        self.gate = Gate(32)
        self.head = nn.Linear(32, 4)

    def forward(self, x):
        return self.head(self.gate(torch.tanh(self.fc(x))))


def example_inputs():
    return (torch.randn(8, 16),)
