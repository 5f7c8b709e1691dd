"""Broken on purpose: `norm.gain` is float64 (as torch.from_numpy(np.ones(n)) gives), so the float32
model silently computes — and returns — float64. doctor names `norm.gain` (dtype-mismatch)."""
import torch
from torch import nn


class Rescale(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.gain = nn.Parameter(torch.ones(dim, dtype=torch.float64))  # BUG: float64

    def forward(self, x):
        return x * self.gain


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 8)
        self.norm = Rescale(8)

    def forward(self, x):
        return self.norm(self.fc(x))


def build() -> nn.Module:
    return Net()


def example_inputs():
    return (torch.randn(8, 16),)
