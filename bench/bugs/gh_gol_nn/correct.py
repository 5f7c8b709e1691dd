"""GitHub gol_nn, correct: the same CNN with mean squared error and Adam(lr=0.01), batch 64, 2 epochs."""
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bugdata as D  # noqa: E402
import harness as H  # noqa: E402

LOSS = "mse"


def model() -> nn.Module:
    return nn.Sequential(H.conv2d(1, 10, 3), nn.ReLU(), H.conv2d(10, 20, 1), nn.ReLU(), H.conv2d(20, 1, 1), nn.Sigmoid())


def data(seed: int):
    return D.game_of_life(8000, 2000, seed)


def batch():
    x, y, _, _ = data(0)
    return torch.as_tensor(x[:64], dtype=torch.float32), torch.as_tensor(y[:64], dtype=torch.float32)


def loss(out, target):
    return H.keras_loss(LOSS)(out, target)


def main() -> None:
    a = H.parse(default_epochs=2)
    H.seed_all(a.seed)
    m = model()
    opt, sched = H.optimizer("adam", m.parameters(), lr=0.01)
    x, y, xv, yv = data(a.seed)
    H.fit(m, LOSS, opt, x, y, epochs=a.epochs, batch_size=64, task="binary", x_val=xv, y_val=yv,
          sched=sched)


if __name__ == "__main__":
    main()
