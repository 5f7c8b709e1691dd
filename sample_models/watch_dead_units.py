"""Bug: one batch with wrong targets (-30 where the targets are positive: a label mix-up in the data, at
step --bad-step, default 40) makes one huge SGD step that pushes most first-layer units negative for every
(non-negative) input: about 70% of the ReLU units are zero from then on (dead) and never recover, while
the loss comes back down."""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--bad-step", type=int, default=40)
    args = ap.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    w = torch.randn(8, 1).abs()
    for step in range(1, args.steps + 1):
        x = torch.rand(32, 8)        # features in [0, 1) (pixel-like)
        y = x @ w
        if step == args.bad_step:
            y = torch.full_like(y, -30.0)   # the bug
        loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()


if __name__ == "__main__":
    main()
