"""Bug: optimizer.zero_grad() is never called, so every step applies the sum of all gradients so far
(from step 2 on)."""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    args = ap.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    w = torch.randn(8, 1)
    for _ in range(args.steps):
        x = torch.randn(32, 8)
        loss = F.mse_loss(model(x), x @ w)
        loss.backward()          # the bug: no opt.zero_grad()
        opt.step()


if __name__ == "__main__":
    main()
