"""StackOverflow 58609115, correct: ReLU hidden layers and a softmax output with categorical cross-entropy,
Adam, batch 50, 10 epochs."""
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bugdata as D  # noqa: E402
import harness as H  # noqa: E402

LOSS = "categorical_crossentropy"


def model() -> nn.Module:
    return nn.Sequential(H.dense(1, 69, 'normal'), nn.ReLU(), H.dense(69, 69, 'normal'), nn.ReLU(), H.dense(69, 69, 'normal'), H.Softmax1())


def data(seed: int):
    return D.scalar_to_class(2209, 69, seed)


def batch():
    x, y, _, _ = data(0)
    return torch.as_tensor(x[:64], dtype=torch.float32), torch.as_tensor(y[:64], dtype=torch.float32)


def loss(out, target):
    return H.keras_loss(LOSS)(out, target)


def main() -> None:
    a = H.parse(default_epochs=10)
    H.seed_all(a.seed)
    m = model()
    opt, sched = H.optimizer("adam", m.parameters())
    x, y, xv, yv = data(a.seed)
    H.fit(m, LOSS, opt, x, y, epochs=a.epochs, batch_size=50, task="categorical", x_val=xv, y_val=yv,
          sched=sched)


if __name__ == "__main__":
    main()
