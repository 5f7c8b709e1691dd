"""StackOverflow 52800582, correct: x and y standardised, a 1-50-50-1 MLP (ReLU, then ELU), MSE, Adam,
full batch, 1000 epochs (the post runs 100 x 1000)."""
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bugdata as D  # noqa: E402
import harness as H  # noqa: E402

LOSS = "mse"


def model() -> nn.Module:
    return nn.Sequential(H.dense(1, 50), nn.ReLU(), H.dense(50, 50), nn.ELU(), H.dense(50, 1))


def data(seed: int):
    return D.quartic(scale=True)


def batch():
    x, y, _, _ = data(0)
    return torch.as_tensor(x[:400], dtype=torch.float32), torch.as_tensor(y[:400], dtype=torch.float32)


def loss(out, target):
    return H.keras_loss(LOSS)(out, target)


def main() -> None:
    a = H.parse(default_epochs=1000)
    H.seed_all(a.seed)
    m = model()
    opt, sched = H.optimizer("adam", m.parameters())
    x, y, xv, yv = data(a.seed)
    H.fit(m, LOSS, opt, x, y, epochs=a.epochs, batch_size=400, task="regression", x_val=xv, y_val=yv,
          sched=sched)


if __name__ == "__main__":
    main()
