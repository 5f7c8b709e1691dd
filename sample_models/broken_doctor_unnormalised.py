"""Broken on purpose: the images reach the model as raw pixel values in [0, 255] (uint8 cast to float,
never divided by 255 nor normalised). doctor warns on input[0] (unnormalised-input)."""
import torch
from torch import nn


def build() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(8, 10))


def example_inputs():
    pixels = torch.randint(0, 256, (4, 3, 16, 16), dtype=torch.uint8)
    return (pixels.float(),)   # BUG: should be pixels.float() / 255, then Normalize(mean, std)
