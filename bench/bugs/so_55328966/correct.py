"""StackOverflow 55328966, correct: pixels /255 (here digits in 0..1), the same layers with a softmax
output, gradient descent lr 1e-4, batch 32, 10 epochs."""
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bugdata as D  # noqa: E402
import harness as H  # noqa: E402

LOSS = "categorical_crossentropy"


def model() -> nn.Module:
    return nn.Sequential(H.dense(784, 784), H.dense(784, 50), nn.ReLU(), H.dense(50, 10), H.Softmax1())


def data(seed: int):
    return D.digits(size=28, scale=True, onehot=True, seed=seed)


def batch():
    x, y, _, _ = data(0)
    return torch.as_tensor(x[:64], dtype=torch.float32), torch.as_tensor(y[:64], dtype=torch.float32)


def loss(out, target):
    return H.keras_loss(LOSS)(out, target)


def main() -> None:
    a = H.parse(default_epochs=10)
    H.seed_all(a.seed)
    m = model()
    opt, sched = H.optimizer("sgd", m.parameters(), lr=0.0001)
    x, y, xv, yv = data(a.seed)
    H.fit(m, LOSS, opt, x, y, epochs=a.epochs, batch_size=32, task="categorical", x_val=xv, y_val=yv,
          sched=sched)


if __name__ == "__main__":
    main()
