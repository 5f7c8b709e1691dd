"""A model with two inputs (image and tabular features) and a frozen branch.
Input: -i 4x3x16x16 -i 4x12."""
import torch
from torch import nn


class TwoInput(nn.Module):
    def __init__(self):
        super().__init__()
        self.image = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.table = nn.Sequential(nn.Linear(12, 8), nn.ReLU())
        self.head = nn.Linear(16, 3)
        self.aux_head = nn.Linear(16, 2)   # defined but never called in forward
        for p in self.table.parameters():  # a frozen branch
            p.requires_grad_(False)

    def forward(self, image, features):
        return self.head(torch.cat([self.image(image), self.table(features)], dim=1))


def build() -> nn.Module:
    return TwoInput()
