"""StackOverflow 48594888, correct: pixels /255, conv 3x3 (64) ReLU, pool, conv 2x2 (256) ReLU, pool, dense 1024
ReLU, dropout 0.4, softmax; categorical cross-entropy, Adam, batch 500, 5 epochs."""
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bugdata as D  # noqa: E402
import harness as H  # noqa: E402

LOSS = "categorical_crossentropy"


def model() -> nn.Module:
    return nn.Sequential(H.Lambda(1 / 255.0, 0.0), H.conv2d(3, 64, 3, 'he_normal'), nn.ReLU(), nn.MaxPool2d(2), H.conv2d(64, 256, 2, 'he_normal'), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), H.dense(256 * 7 * 7, 1024), nn.ReLU(), nn.Dropout(0.4), H.dense(1024, 10), H.Softmax1())


def data(seed: int):
    return D.class_templates(2000, 10, seed)


def batch():
    x, y, _, _ = data(0)
    return torch.as_tensor(x[:32], dtype=torch.float32), torch.as_tensor(y[:32], dtype=torch.float32)


def loss(out, target):
    return H.keras_loss(LOSS)(out, target)


def main() -> None:
    a = H.parse(default_epochs=5)
    H.seed_all(a.seed)
    m = model()
    opt, sched = H.optimizer("adam", m.parameters())
    x, y, xv, yv = data(a.seed)
    H.fit(m, LOSS, opt, x, y, epochs=a.epochs, batch_size=500, task="categorical", x_val=xv, y_val=yv,
          sched=sched)


if __name__ == "__main__":
    main()
