"""Bug: a binary classifier whose output is a softmax over ONE unit (always exactly 1.0), trained with
binary cross-entropy (or, with --loss ce, cross-entropy over that one class). The output is constant, so
the loss is constant in every parameter: every gradient is exactly 0 and nothing trains. With --fix the
output is a sigmoid (the model trains)."""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--loss", choices=("bce", "ce"), default="bce")
    ap.add_argument("--fix", action="store_true")
    args = ap.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    w = torch.randn(4)
    for _ in range(args.steps):
        x = torch.randn(32, 4)
        y = (x @ w > 0).float()
        logits = model(x)
        if args.loss == "ce":   # one class: log_softmax is 0 whatever the logit
            loss = F.cross_entropy(logits, torch.zeros(32, dtype=torch.long))
        else:
            p = torch.sigmoid(logits) if args.fix else torch.softmax(logits, dim=1)   # the bug: softmax over 1 unit
            loss = F.binary_cross_entropy(p.squeeze(1), y)
        opt.zero_grad()
        loss.backward()
        opt.step()


if __name__ == "__main__":
    main()
