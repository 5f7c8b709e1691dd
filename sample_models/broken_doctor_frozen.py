"""Broken on purpose: the factory freezes the backbone "for fine-tuning" and forgets to unfreeze it,
so only `head` trains. doctor lists `backbone` (frozen, info)."""
import torch
from torch import nn


def build() -> nn.Module:
    model = nn.Sequential()
    model.add_module("backbone", nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32)))
    model.add_module("head", nn.Linear(32, 4))
    for p in model.backbone.parameters():
        p.requires_grad = False     # BUG (if unintended): never unfrozen
    return model


def example_inputs():
    return (torch.randn(8, 16),)
