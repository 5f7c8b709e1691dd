"""A healthy training script (watch's no-false-alarm case): a small CNN with BatchNorm and dropout learns a
synthetic task (which quadrant holds the bright blob), SGD with momentum, a validation pass each epoch in
eval mode under no_grad, then back to train mode. Run: python watch_healthy_cnn.py --epochs 2"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

try:   # log the validation metrics into torchdiag's watch when one is open (runs unchanged without)
    from torchdiag.diagnostics.watch import log, set_epoch
except ImportError:   # pragma: no cover
    def log(*a, **k):
        pass

    def set_epoch(*a, **k):
        pass


def data(n, g):
    x = torch.randn(n, 1, 16, 16, generator=g) * 0.8
    y = torch.randint(0, 4, (n,), generator=g)
    for i in range(n):
        r, c = divmod(int(y[i]), 2)
        x[i, 0, r * 8 + 2:r * 8 + 6, c * 8 + 2:c * 8 + 6] += 0.8
    return x, y


def build():
    return nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.AdaptiveAvgPool2d(2),
                         nn.Flatten(), nn.Dropout(0.1), nn.Linear(64, 4))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch", type=int, default=32)
    args = ap.parse_args()
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    x, y = data(512, g)
    vx, vy = data(256, g)
    model = build()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for epoch in range(args.epochs):
        set_epoch(epoch)
        model.train()
        perm = torch.randperm(len(x), generator=g)
        for i in range(0, len(x), args.batch):
            idx = perm[i:i + args.batch]
            loss = F.cross_entropy(model(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
        model.eval()
        with torch.no_grad():
            out = model(vx)
            val = F.cross_entropy(out, vy).item()
            acc = (out.argmax(1) == vy).float().mean().item()
        log("val_loss", val)
        log("val_acc", acc)
        print(f"epoch {epoch}: val_loss {val:.3f} val_acc {acc:.3f}")


if __name__ == "__main__":
    main()
