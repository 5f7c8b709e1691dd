"""Models for runs under torchrun with --wrap fsdp (tests/test_distributed_fsdp.py). Each factory seeds
itself, so a test can rebuild the same weights without torchdiag; what differs by rank comes from
torchrun's RANK variable, read in forward.

`softmax`: an MLP ending in a softmax, trained with cross-entropy: the logits the loss sees lie in
   [0, 1], so with 4 classes the loss cannot go below log(1 + 3/e) ≈ 0.742 (cannot-overfit with
   bounded-output, as in broken_overfit_softmax.py); its curve is still a deterministic function of
   the weights and `batch()`, so a test can recompute it with plain torch.
`counted`: Linear → BatchNorm1d → ReLU → Linear, and a plain buffer `seen.count` that each train-mode
   forward increases by 1 + RANK (a rank-dependent update of state FSDP does not synchronise: it
   keeps buffers as plain tensors on every rank). After 2 steps on 2 ranks: count 2 on rank 0, 4 on
   rank 1; the BatchNorm running statistics differ too (each rank's own rows).
`batch()`: 8 inputs of 8 features and 8 class targets in [0, 4), fixed (its own generator)."""
import os

import torch
from torch import nn


class _Seen(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("count", torch.zeros(()))

    def forward(self, x):
        if self.training:
            self.count += 1 + int(os.environ.get("RANK", "0"))
        return x


def softmax() -> nn.Module:
    torch.manual_seed(1234)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4), nn.Softmax(dim=1))


def counted() -> nn.Module:
    torch.manual_seed(1234)
    return nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), _Seen(), nn.Linear(16, 4))


def batch():
    g = torch.Generator().manual_seed(99)
    return torch.randn(8, 8, generator=g), torch.randint(0, 4, (8,), generator=g)


def example_inputs():
    return (batch()[0],)
