"""A frozen layer: the `backbone` is frozen (requires_grad=False) as in fine-tuning, only `head`
trains. Not an error: gradflow reports `frozen` (info) for backbone and exits 0."""
import torch
from torch import nn


def build() -> nn.Module:
    model = nn.Sequential()
    model.add_module("backbone", nn.Sequential(nn.Linear(12, 24), nn.ReLU(), nn.Linear(24, 24), nn.ReLU()))
    model.add_module("head", nn.Linear(24, 3))
    model.backbone.requires_grad_(False)
    return model


def example_inputs():
    return (torch.randn(6, 12),)
