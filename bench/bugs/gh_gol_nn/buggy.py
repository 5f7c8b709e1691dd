"""GitHub gol_nn (DeepLocalize's GitHub set), buggy: a CNN learns one step of Conway's Game of Life on
3x3 tori (wrap-padded to 5x5): conv 3x3 (10) ReLU, conv 1x1 (20) ReLU, conv 1x1 (1) sigmoid; binary
cross-entropy, Adam (Keras default lr 0.001), batch 64, 2 epochs."""
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bugdata as D  # noqa: E402
import harness as H  # noqa: E402

LOSS = "binary_crossentropy"


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
    opt, sched = H.optimizer("adam", m.parameters())
    x, y, xv, yv = data(a.seed)
    H.fit(m, LOSS, opt, x, y, epochs=a.epochs, batch_size=64, task="binary", x_val=xv, y_val=yv,
          sched=sched)


if __name__ == "__main__":
    main()
