"""Broken on purpose: finite at first, non-finite after a few optimizer steps. A linear regression
on un-normalised features (scale ~30): with SGD at lr=0.01 every step overshoots, the weights grow
~17× per step, and the squared error overflows float32 to Inf in step 13 (after 12 updates) (deterministic: fixed
seed, fixed batch).

    torchdiag nancheck sample_models/broken_nan_after_steps.py:build --steps 30 --lr 0.01 --batch sample_models/broken_nan_after_steps.py:batch
"""
import torch
from torch import nn

SCALE = 30.0


def build() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 1))


def example_inputs():
    g = torch.Generator().manual_seed(1)
    return (torch.randn(16, 4, generator=g) * SCALE,)


def batch():
    """(inputs, target) for --batch: the same features and a fixed regression target."""
    g = torch.Generator().manual_seed(2)
    return example_inputs(), torch.randn(16, 1, generator=g)
