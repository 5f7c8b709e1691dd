"""StackOverflow 48934338, buggy: fitting y = 5x^2 + noise^3 with a 1-50-30-1 ReLU MLP (the 30-unit
layer init 'uniform'), MSE, SGD(lr=0.1), Keras' default batch 32, 1000 epochs. The learning rate is far
too high for targets up to 120."""
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bugdata as D  # noqa: E402
import harness as H  # noqa: E402

LOSS = "mse"


def model() -> nn.Module:
    return nn.Sequential(H.dense(1, 50), nn.ReLU(), H.dense(50, 30, "uniform"), nn.ReLU(), H.dense(30, 1))


def batch():
    x, y, _, _ = D.quadratic(0)
    return torch.tensor(x), torch.tensor(y)


def loss(out, target):
    return H.keras_loss(LOSS)(out, target)


def main() -> None:
    a = H.parse(default_epochs=1000)
    H.seed_all(a.seed)
    m = model()
    opt, sched = H.optimizer("sgd", m.parameters(), lr=0.1)
    x, y, xv, yv = D.quadratic(a.seed)
    H.fit(m, LOSS, opt, x, y, epochs=a.epochs, batch_size=32, task="regression", x_val=xv, y_val=yv,
          sched=sched)


if __name__ == "__main__":
    main()
