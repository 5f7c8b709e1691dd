"""Bug: the learning rate is raised 40× at step --bad-step (default 60: a schedule with a wrong
milestone factor); the loss, which had been falling, climbs above where it started."""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--bad-step", type=int, default=60)
    args = ap.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.02)
    sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=[args.bad_step], gamma=40.0)   # meant 0.1
    w = torch.randn(8, 1)
    for _ in range(args.steps):
        x = torch.randn(32, 8)
        loss = F.mse_loss(model(x), x @ w)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()


if __name__ == "__main__":
    main()
