"""StackOverflow 48221692, buggy: 1-D linear regression, 1-5-1 MLP with sigmoid hidden units and
a sigmoid output, MSE, SGD (Keras default lr 0.01), full batch, 1000 epochs."""
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bugdata as D  # noqa: E402
import harness as H  # noqa: E402

LOSS = "mean_squared_error"


def model() -> nn.Module:
    return nn.Sequential(H.dense(1, 5), nn.Sigmoid(), H.dense(5, 1), nn.Sigmoid())


def data(seed: int):
    return D.linear_1d(100, seed)


def batch():
    x, y, _, _ = data(0)
    return torch.as_tensor(x[:75], dtype=torch.float32), torch.as_tensor(y[:75], dtype=torch.float32)


def loss(out, target):
    return H.keras_loss(LOSS)(out, target)


def main() -> None:
    a = H.parse(default_epochs=1000)
    H.seed_all(a.seed)
    m = model()
    opt, sched = H.optimizer("sgd", m.parameters())
    x, y, xv, yv = data(a.seed)
    H.fit(m, LOSS, opt, x, y, epochs=a.epochs, batch_size=75, task="regression", x_val=xv, y_val=yv,
          sched=sched)


if __name__ == "__main__":
    main()
