"""GitHub vincenty2022/Averaging_Neural_Networks (keras_net.py), buggy: the mean of two numbers (each
/100), Dense(2) -> Dense(1) with no activation anywhere (the ReLU hidden layer commented out), MSE,
RMSprop, batch 10, 10 epochs."""
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bugdata_gh as G  # noqa: E402
import harness as H  # noqa: E402

LOSS = "mse"


def model() -> nn.Module:
    return nn.Sequential(H.dense(2, 2), H.dense(2, 1))


def data(seed: int):
    return G.averages(seed)


def batch():
    x, y, _, _ = data(0)
    return torch.as_tensor(x[:64]), torch.as_tensor(y[:64])


def loss(out, target):
    return H.keras_loss(LOSS)(out, target)


def main() -> None:
    a = H.parse(default_epochs=10)
    H.seed_all(a.seed)
    m = model()
    opt, sched = H.optimizer("rmsprop", m.parameters())
    x, y, xv, yv = data(a.seed)
    H.fit(m, LOSS, opt, x, y, epochs=a.epochs, batch_size=10, task="regression", x_val=xv, y_val=yv,
          sched=sched)


if __name__ == "__main__":
    main()
