"""Broken on purpose: dead ReLUs. 48 of the 64 units of `fc1` have a bias of -5 (as after a
too-large update), so `act1` outputs 0 for them on every input: 75% dead units. The other 16
units have bias +5 and are always alive. gradflow: dead-units (warning) where = act1; exit 0,
exit 1 with --strict."""
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self, dead: int = 48):
        super().__init__()
        self.fc1 = nn.Linear(10, 64)
        self.act1 = nn.ReLU()
        self.fc2 = nn.Linear(64, 4)
        with torch.no_grad():
            self.fc1.weight.uniform_(-0.1, 0.1)       # |w·x| < 1 for inputs in [-1, 1)
            self.fc1.bias.fill_(5.0)
            self.fc1.bias[:dead] = -5.0

    def forward(self, x):
        return self.fc2(self.act1(self.fc1(x)))


def build(dead: int = 48) -> nn.Module:
    return Net(dead)


def example_inputs():
    return (torch.rand(8, 10) * 2 - 1,)
