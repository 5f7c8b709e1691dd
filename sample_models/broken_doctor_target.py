"""Broken on purpose: labels are 1-based (1…10) while the classifier has 10 outputs (0…9).
`batch()` gives (inputs, target); doctor reports target-out-of-range on the output.
Run: torchdiag doctor sample_models/broken_doctor_target.py:build --batch sample_models/broken_doctor_target.py:batch"""
import torch
from torch import nn


def build() -> nn.Module:
    return nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 10))


def batch():
    x = torch.randn(16, 12)
    y = torch.arange(16) % 10 + 1     # BUG: 1-based labels 1…10
    return x, y


def example_inputs():
    return (torch.randn(16, 12),)
