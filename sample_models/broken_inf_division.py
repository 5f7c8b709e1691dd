"""Broken on purpose: Inf from a division. `pool` averages the valid tokens of each sequence but
divides the unmasked sum by the number of valid tokens; sequence 2 of the example batch has no
valid token, so its 8 pooled features are ±Inf (x/0). `head` then mixes +Inf and -Inf into NaN.

    torchdiag nancheck sample_models/broken_inf_division.py:build    # culprit: pool (MaskedMeanPool)
"""
import torch
from torch import nn


class MaskedMeanPool(nn.Module):
    def forward(self, x, mask):
        # bug: x is not masked and an empty mask divides by zero
        return x.sum(dim=1) / mask.sum(dim=1, keepdim=True)


class InfDivision(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(8, 8)
        self.pool = MaskedMeanPool()
        self.head = nn.Linear(8, 3)

    def forward(self, x, mask):
        return self.head(self.pool(self.embed(x), mask))


def build() -> nn.Module:
    torch.manual_seed(0)
    return InfDivision()


def example_inputs():
    x = torch.randn(4, 6, 8)
    mask = torch.ones(4, 6)
    mask[1, 3:] = 0
    mask[2, :] = 0          # an empty sequence
    return (x, mask)
