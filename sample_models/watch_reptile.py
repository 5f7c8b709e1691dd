"""Healthy: Reptile (Nichol et al., 2018) on random sine tasks. Each task trains a fresh copy of the model with its
own SGD for a few steps and moves the model a tenth of the way towards the copy. The losses watch sees are per
task: amplitudes from 0.1 to 5 make them spread over decades with no trend, which is noise, not divergence."""
import argparse
import copy
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", type=int, default=60)
    ap.add_argument("--inner", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    model = nn.Sequential(nn.Linear(1, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))
    for _ in range(args.tasks):
        amp, phase = torch.empty(1).uniform_(0.1, 5.0), torch.empty(1).uniform_(0, math.pi)
        clone = copy.deepcopy(model)
        opt = torch.optim.SGD(clone.parameters(), lr=0.02)
        for _ in range(args.inner):
            x = torch.empty(10, 1).uniform_(-5, 5)
            loss = F.mse_loss(clone(x), amp * torch.sin(x + phase))
            opt.zero_grad()
            loss.backward()
            opt.step()
        with torch.no_grad():
            for p, q in zip(model.parameters(), clone.parameters()):
                p += 0.1 * (q - p)


if __name__ == "__main__":
    main()
