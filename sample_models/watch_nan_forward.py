"""Bug: a NaN in the forward at step --bad-step (default 30): the model takes log() of its inputs, and that
step's batch holds a negative value (a corrupt sample). watch names the step and, replaying the batch on
the weights of that step, the module (0, LogFeatures) and the direction (forward)."""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


class LogFeatures(nn.Module):
    def forward(self, x):
        return torch.log(x)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--bad-step", type=int, default=30)
    args = ap.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(LogFeatures(), nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(1, args.steps + 1):
        x = torch.rand(16, 8) + 0.5
        y = (x[:, 0] > 1.0).long()
        if step == args.bad_step:
            x[3, 5] = -1.0          # the corrupt sample
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()


if __name__ == "__main__":
    main()
