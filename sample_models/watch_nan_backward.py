"""Bug: a NaN born in the backward at step --bad-step (default 30): the model appends each row's length
sqrt(sum x²) as a feature; the forward of an all-zero row is finite (0), its gradient is not (0 * inf).
watch names the step and, on replay, the module (radius) and the direction (backward)."""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


class Radius(nn.Module):
    def forward(self, x):
        return torch.cat([x, x.pow(2).sum(-1, keepdim=True).sqrt()], dim=-1)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(4, 8, bias=False)
        self.radius = Radius()
        self.out = nn.Linear(9, 1)

    def forward(self, x):
        return self.out(torch.tanh(self.radius(self.inp(x))))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--bad-step", type=int, default=30)
    args = ap.parse_args()
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(1, args.steps + 1):
        x = torch.randn(16, 4)
        y = x.sum(1, keepdim=True)
        if step == args.bad_step:
            x[2] = 0.0               # an empty sample: its hidden row is exactly 0
        loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()


if __name__ == "__main__":
    main()
