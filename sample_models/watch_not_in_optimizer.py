"""Bug: the classifier head is not in the optimizer (only the body's parameters were passed): the head
gets gradients from step 1 but never trains."""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 32), nn.ReLU())
        self.head = nn.Linear(32, 3)

    def forward(self, x):
        return self.head(self.body(x))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    args = ap.parse_args()
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.Adam(model.body.parameters(), lr=1e-2)     # the bug: model.parameters()
    w = torch.randn(8, 3)
    for _ in range(args.steps):
        x = torch.randn(32, 8)
        loss = F.cross_entropy(model(x), (x @ w).argmax(1))
        opt.zero_grad()
        loss.backward()
        opt.step()


if __name__ == "__main__":
    main()
