"""StackOverflow 59325381, correct: labels untouched and one-hot, the same network, categorical
cross-entropy, Adam, Keras' default batch 32, 10 epochs."""
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bugdata as D  # noqa: E402
import harness as H  # noqa: E402

LOSS = "categorical_crossentropy"


def model() -> nn.Module:
    return nn.Sequential(H.conv2d(1, 64, 3, padding=1), nn.MaxPool2d(2), H.conv2d(64, 32, 3, padding=1), nn.MaxPool2d(2), nn.Flatten(), H.dense(32 * 7 * 7, 128), nn.ReLU(), H.dense(128, 10), H.Softmax1())


def data(seed: int):
    return D.digits(flat=False, size=28, onehot=True, seed=seed)


def batch():
    x, y, _, _ = data(0)
    return torch.as_tensor(x[:32], dtype=torch.float32), torch.as_tensor(y[:32], dtype=torch.float32)


def loss(out, target):
    return H.keras_loss(LOSS)(out, target)


def main() -> None:
    a = H.parse(default_epochs=10)
    H.seed_all(a.seed)
    m = model()
    opt, sched = H.optimizer("adam", m.parameters())
    x, y, xv, yv = data(a.seed)
    H.fit(m, LOSS, opt, x, y, epochs=a.epochs, batch_size=32, task="categorical", x_val=xv, y_val=yv,
          sched=sched)


if __name__ == "__main__":
    main()
