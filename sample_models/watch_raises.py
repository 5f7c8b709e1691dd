"""The script's own failure: it raises at step --bad-step (default 25); watch keeps the report so far (exit 3)."""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bad-step", type=int, default=25)
    args = ap.parse_args()
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(1, 100):
        if step == args.bad_step:
            raise RuntimeError(f"data loader lost its shard at step {step}")
        x = torch.randn(8, 4)
        loss = F.mse_loss(model(x), x.sum(1, keepdim=True))
        opt.zero_grad()
        loss.backward()
        opt.step()


if __name__ == "__main__":
    main()
