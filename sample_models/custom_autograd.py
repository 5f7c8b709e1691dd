"""Hand-written autograd code for `torchdiag gradcheck`: correct ones and deliberately wrong ones.

    torchdiag gradcheck sample_models/custom_autograd.py:MulSquare -i 3 -i 3        # passes
    torchdiag gradcheck sample_models/custom_autograd.py:WrongMulSquare -i 3 -i 3   # exit 1: input[1]
    torchdiag gradcheck sample_models/custom_autograd.py:DetachedCube -i 4 --second-order  # 2nd order wrong
    torchdiag gradcheck sample_models/custom_autograd.py:ScaledTanh -i 2x3          # an nn.Module, params too
"""
import torch
from torch import nn


class MulSquare(torch.autograd.Function):
    """f(x, y) = x · y²  (elementwise); df/dx = y², df/dy = 2·x·y. Correct, also to second order."""

    @staticmethod
    def forward(ctx, x, y):
        ctx.save_for_backward(x, y)
        return x * y * y

    @staticmethod
    def backward(ctx, grad):
        x, y = ctx.saved_tensors
        return grad * y * y, grad * 2 * x * y


class WrongMulSquare(torch.autograd.Function):
    """Same forward as MulSquare; backward forgets the factor 2 in df/dy (the bug to find).
    The error at element j of input[1] is |x_j · y_j|: the largest |x·y| is the worst element."""

    @staticmethod
    def forward(ctx, x, y):
        ctx.save_for_backward(x, y)
        return x * y * y

    @staticmethod
    def backward(ctx, grad):
        x, y = ctx.saved_tensors
        return grad * y * y, grad * x * y   # should be 2·x·y


class DetachedCube(torch.autograd.Function):
    """f(x) = x³; the first derivative 3x² is right, but computed from a detached x, so the
    second derivative (6x) is lost: passes first order, fails --second-order."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x ** 3

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * 3 * x.detach() ** 2


def softclip(x):
    """A plain function built on a correct Function: 2·tanh(x/2)."""
    return 2 * torch.tanh(x / 2)


class ScaledTanh(nn.Module):
    """y = a · tanh(W x + b): an nn.Module, checked with respect to its input and parameters."""

    def __init__(self, features: int = 3):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.lin = nn.Linear(features, features)
        with torch.no_grad():
            self.lin.weight.copy_(torch.randn(features, features, generator=g) * 0.5)
        self.a = nn.Parameter(torch.tensor(1.5))

    def forward(self, x):
        return self.a * torch.tanh(self.lin(x))


def example_inputs():
    return (torch.randn(3), torch.randn(3))
