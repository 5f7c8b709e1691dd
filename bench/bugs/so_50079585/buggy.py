"""StackOverflow 50079585, buggy: 3-class car-damage photos (150x150 RGB; here a synthetic stand-in) read with
class_mode='binary' (labels 0, 1, 2 as one number), conv 32/32/64 3x3 ReLU + pools, dense 64 ReLU, dropout
0.5, ONE sigmoid output with binary cross-entropy, RMSprop, batch 16, 10 epochs (here 3)."""
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bugdata as D  # noqa: E402
import harness as H  # noqa: E402

LOSS = "binary_crossentropy"


def model() -> nn.Module:
    return nn.Sequential(H.Lambda(1 / 255.0, 0.0), H.conv2d(3, 32, 3), nn.ReLU(), nn.MaxPool2d(2), H.conv2d(32, 32, 3), nn.ReLU(), nn.MaxPool2d(2), H.conv2d(32, 64, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), H.dense(64 * 17 * 17, 64), nn.ReLU(), nn.Dropout(0.5), H.dense(64, 1), nn.Sigmoid())


def data(seed: int):
    return D.class_templates(1150, 3, seed, shape=(3, 150, 150), test_size=0.15, labels="index")


def batch():
    x, y, _, _ = data(0)
    return torch.as_tensor(x[:16], dtype=torch.float32), torch.as_tensor(y[:16], dtype=torch.float32)


def loss(out, target):
    return H.keras_loss(LOSS)(out, target)


def main() -> None:
    a = H.parse(default_epochs=3)
    H.seed_all(a.seed)
    m = model()
    opt, sched = H.optimizer("rmsprop", m.parameters())
    x, y, xv, yv = data(a.seed)
    H.fit(m, LOSS, opt, x, y, epochs=a.epochs, batch_size=16, task="binary", x_val=xv, y_val=yv,
          sched=sched)


if __name__ == "__main__":
    main()
