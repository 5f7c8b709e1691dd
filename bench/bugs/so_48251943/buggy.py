"""StackOverflow 48251943, buggy: regression of a 2-feature target, 2-4-1 MLP with ReLU hidden
and a ReLU output, MSE, SGD (Keras default lr 0.01), batch 10, 50 epochs."""
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bugdata as D  # noqa: E402
import harness as H  # noqa: E402

LOSS = "mean_squared_error"


def model() -> nn.Module:
    return nn.Sequential(H.dense(2, 4), nn.ReLU(), H.dense(4, 1), nn.ReLU())


def data(seed: int):
    return D.tanh_regression(200, seed)


def batch():
    x, y, _, _ = data(0)
    return torch.as_tensor(x[:64], dtype=torch.float32), torch.as_tensor(y[:64], dtype=torch.float32)


def loss(out, target):
    return H.keras_loss(LOSS)(out, target)


def main() -> None:
    a = H.parse(default_epochs=50)
    H.seed_all(a.seed)
    m = model()
    opt, sched = H.optimizer("sgd", m.parameters())
    x, y, xv, yv = data(a.seed)
    H.fit(m, LOSS, opt, x, y, epochs=a.epochs, batch_size=10, task="regression", x_val=xv, y_val=yv,
          sched=sched)


if __name__ == "__main__":
    main()
