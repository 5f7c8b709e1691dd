"""StackOverflow 34673164, buggy: 16 raw features -> two one-hot classes, 16-64-64-2 tanh MLP (init
'uniform', dropout 0.5) with a softmax under mean squared error, SGD(lr=0.1, momentum 0.9, nesterov,
decay 1e-6), batch 16, 20 epochs."""
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bugdata as D  # noqa: E402
import harness as H  # noqa: E402

LOSS = "mean_squared_error"


def model() -> nn.Module:
    return nn.Sequential(H.dense(16, 64, 'uniform'), nn.Tanh(), nn.Dropout(0.5), H.dense(64, 64, 'uniform'), nn.Tanh(), nn.Dropout(0.5), H.dense(64, 2, 'uniform'), H.Softmax1())


def data(seed: int):
    return D.blobs_onehot(1000, 16, seed, scale=50.0, offset=100.0)


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
    H.fit(m, LOSS, opt, x, y, epochs=a.epochs, batch_size=16, task="categorical", x_val=xv, y_val=yv,
          sched=sched)


if __name__ == "__main__":
    main()
