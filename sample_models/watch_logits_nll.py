"""Bug: nn.NLLLoss given the model's raw logits (no log_softmax): it negates the target's value, so the loss falls
below 0 without bound while the other classes get no gradient (accuracy stays at chance). `--fixed` adds the
LogSoftmax; `--log` takes the log of a softmax's output with a floor added (log(p + 0.01): its exps sum above 1,
yet no value is above log(1.01)); `--padded` gives log-probabilities whose padded rows are filled with 0 and ignored
(their targets ignore_index); `--both` adds a second loss, a softmax's output given to CrossEntropyLoss (two bugs)."""
import argparse

import torch
import torch.nn as nn


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--fixed", action="store_true")
    ap.add_argument("--log", action="store_true")
    ap.add_argument("--padded", action="store_true")
    ap.add_argument("--both", action="store_true")
    args = ap.parse_args()
    torch.manual_seed(0)
    layers = [nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4)]
    end = [nn.LogSoftmax(dim=1)] if args.fixed or args.padded else [nn.Softmax(dim=1)] if args.log else []
    model = nn.Sequential(*layers, *end)
    criterion = nn.NLLLoss()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    w = torch.randn(8, 4)
    for _ in range(args.steps):
        x = torch.randn(32, 8)
        out, y = model(x), (x @ w).argmax(1)
        if args.padded:   # the last 8 rows are padding: zeroed, and not scored
            pad = torch.arange(32) >= 24
            out, y = out.masked_fill(pad[:, None], 0.0), y.masked_fill(pad, -100)
        loss = criterion(torch.log(out + 0.01) if args.log else out, y)
        if args.both:
            loss = loss + nn.CrossEntropyLoss()(torch.softmax(out, 1), y)
        opt.zero_grad()
        loss.backward()
        opt.step()


if __name__ == "__main__":
    main()
