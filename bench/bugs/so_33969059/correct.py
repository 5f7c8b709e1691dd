"""StackOverflow 33969059, correct: the weights and offset divided by their largest magnitude,
the same MLP with a linear output, MSE, the same SGD, batch 32, 20 epochs."""
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bugdata as D  # noqa: E402
import harness as H  # noqa: E402

LOSS = "mean_squared_error"


def model() -> nn.Module:
    return nn.Sequential(H.dense(3, 3, 'uniform'), nn.Tanh(), nn.Dropout(0.5), H.dense(3, 2, 'uniform'), nn.Tanh(), nn.Dropout(0.5), H.dense(2, 1, 'uniform'))


def data(seed: int):
    return D.linear_big(5000, 1000, seed, normalise_weights=True)


def batch():
    x, y, _, _ = data(0)
    return torch.as_tensor(x[:64], dtype=torch.float32), torch.as_tensor(y[:64], dtype=torch.float32)


def loss(out, target):
    return H.keras_loss(LOSS)(out, target)


def main() -> None:
    a = H.parse(default_epochs=20)
    H.seed_all(a.seed)
    m = model()
    opt, sched = H.optimizer("sgd", m.parameters(), lr=0.1, momentum=0.9, nesterov=True, decay=1e-6)
    x, y, xv, yv = data(a.seed)
    H.fit(m, LOSS, opt, x, y, epochs=a.epochs, batch_size=32, task="regression", x_val=xv, y_val=yv,
          sched=sched)


if __name__ == "__main__":
    main()
