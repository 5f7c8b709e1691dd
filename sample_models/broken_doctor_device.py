"""Broken on purpose: `pos` builds its position ids with torch.arange(n) — no device= — so on a GPU
the model fails (cpu index vs cuda tensor). doctor finds it without a GPU (device-mismatch in pos)."""
import torch
from torch import nn


class LearnedPositions(nn.Module):
    def __init__(self, length: int, dim: int):
        super().__init__()
        self.table = nn.Parameter(torch.randn(length, dim) * 0.02)
        self.scale = nn.Parameter(torch.ones(length))

    def forward(self, x):                        # x: N x L x D
        n = x.shape[1]
        ramp = torch.arange(n, dtype=x.dtype) / n   # BUG: lands on the CPU whatever the model's device
        return x + self.table[:n] * (self.scale[:n] + ramp)[:, None]


class Tagger(nn.Module):
    def __init__(self, vocab: int = 100, dim: int = 16, length: int = 12, tags: int = 5):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = LearnedPositions(length, dim)
        self.head = nn.Linear(dim, tags)

    def forward(self, ids):
        return self.head(self.pos(self.embed(ids))).mean(1)


def build() -> nn.Module:
    return Tagger()


def example_inputs():
    return (torch.randint(0, 100, (4, 12)),)
