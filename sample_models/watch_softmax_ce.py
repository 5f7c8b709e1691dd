"""Bug: the model ends in a softmax and is trained with nn.CrossEntropyLoss, which applies log_softmax itself: the
gradients are squashed and the loss cannot fall below log(1 + (C - 1)/e). `--fixed` drops the softmax (logits)."""
import argparse

import torch
import torch.nn as nn


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--fixed", action="store_true")
    args = ap.parse_args()
    torch.manual_seed(0)
    layers = [nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4)]
    model = nn.Sequential(*layers, *([] if args.fixed else [nn.Softmax(dim=1)]))   # the bug: the softmax
    criterion = nn.CrossEntropyLoss()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    w = torch.randn(8, 4)
    for _ in range(args.steps):
        x = torch.randn(32, 8)
        loss = criterion(model(x), (x @ w).argmax(1))
        opt.zero_grad()
        loss.backward()
        opt.step()


if __name__ == "__main__":
    main()
