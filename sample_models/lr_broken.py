"""Models whose learning-rate range test has no right answer, by construction.

- `ascends`: the gradient is reversed inside the model (a custom backward with a sign error), so every
  update climbs the loss: it rises at every rate, and diverges at large ones.
- `flat`: the only trainable parameter enters the output scaled by 1e-9: no rate in 1e-7…10 moves the
  loss by 1%, so the curve is flat and there is nothing to suggest.
- `noisy`: as `flat`, but heavy dropout on the input makes the loss scatter from update to update:
  whatever moves is noise."""
import torch
from torch import nn


class Reverse(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return -grad          # the sign error


class Ascends(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 4)

    def forward(self, x):
        return Reverse.apply(self.fc(x))


class Tiny(nn.Module):
    def __init__(self, dropout: float = 0.0):
        super().__init__()
        self.fixed = nn.Linear(16, 4)
        self.fixed.requires_grad_(False)
        self.bias = nn.Parameter(torch.zeros(4))
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        return self.fixed(self.drop(x)) + 1e-9 * self.bias


def _with_input(model):
    model.example_input_array = torch.randn(32, 16, generator=torch.Generator().manual_seed(0))
    return model


def ascends() -> nn.Module:
    torch.manual_seed(0)
    return _with_input(Ascends())


def flat() -> nn.Module:
    torch.manual_seed(0)
    return _with_input(Tiny())


def noisy() -> nn.Module:
    torch.manual_seed(0)
    return _with_input(Tiny(dropout=0.5))
