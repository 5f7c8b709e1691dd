"""Bug: a validation pass at step --bad-step (default 20) calls model.eval() and the loop never calls
model.train() again: every later step trains with dropout off and BatchNorm frozen."""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--bad-step", type=int, default=20)
    args = ap.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 3))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    w = torch.randn(8, 3)
    model.train()
    for step in range(1, args.steps + 1):
        x = torch.randn(32, 8)
        loss = F.cross_entropy(model(x), (x @ w).argmax(1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step == args.bad_step:
            model.eval()               # the bug: no model.train() after this validation
            with torch.no_grad():
                model(torch.randn(64, 8))


if __name__ == "__main__":
    main()
