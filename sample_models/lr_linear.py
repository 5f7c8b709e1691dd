"""Least squares y = Xw with a fixed X: its good learning-rate range is known in closed form.

With the mean-squared error over N rows, loss(w) = ||Xw − y||² / N has the Hessian 2 XᵀX / N; its largest
eigenvalue L = 2 λ_max(XᵀX) / N bounds plain gradient descent (SGD without momentum): every step at a rate
below 2/L shrinks the loss, above it the top direction grows by |1 − lr·L| per step. (With heavy-ball
momentum β the limit is 2(1 + β)/L: the CLI's sgd has β = 0.9; plain SGD is `momentum=0.0` in Python.)

    torchdiag.api.run("lr-find", build(), batch()[0], target=batch()[1], loss="mse", optimizer="sgd", momentum=0.0)"""
import torch
from torch import nn

N, D = 64, 8


def data(n: int = N, d: int = D, seed: int = 0):
    """(X, y): X with columns of different scales (so λ_max stands out), y from a known w plus noise."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g) * torch.linspace(0.5, 3.0, d)
    w = torch.randn(d, 1, generator=g)
    y = x @ w + 0.1 * torch.randn(n, 1, generator=g)
    return x, y


def lipschitz(x) -> float:
    """L = 2 λ_max(XᵀX) / N for the mean-squared error (the test recomputes it itself)."""
    return float(2 * torch.linalg.eigvalsh(x.T @ x).max() / x.shape[0])


def build(d: int = D) -> nn.Module:
    torch.manual_seed(0)
    model = nn.Linear(d, 1, bias=False)
    model.example_input_array = data(d=d)[0]
    return model


def batch():
    return data()
