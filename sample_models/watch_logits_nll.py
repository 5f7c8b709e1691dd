"""Bug: nn.NLLLoss given the model's raw logits (no log_softmax): it negates the target's value, so the loss falls
below 0 without bound while the other classes get no gradient (accuracy stays at chance). `--fixed` adds the
LogSoftmax; `--log` takes the log of a softmax's output with a small floor added (log(p + 1e-8): its exps sum to
a hair above 1, still log-probabilities)."""
import argparse

import torch
import torch.nn as nn


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--fixed", action="store_true")
    ap.add_argument("--log", action="store_true")
    args = ap.parse_args()
    torch.manual_seed(0)
    layers = [nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4)]
    end = [nn.LogSoftmax(dim=1)] if args.fixed else [nn.Softmax(dim=1)] if args.log else []
    model = nn.Sequential(*layers, *end)
    criterion = nn.NLLLoss()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    w = torch.randn(8, 4)
    for _ in range(args.steps):
        x = torch.randn(32, 8)
        out = model(x)
        loss = criterion(torch.log(out + 1e-8) if args.log else out, (x @ w).argmax(1))
        opt.zero_grad()
        loss.backward()
        opt.step()


if __name__ == "__main__":
    main()
