"""StackOverflow 44066044, buggy: binary classification of 11 raw network-packet features,
11-12-12-1 MLP (init 'normal') with ReLU hidden units and a ReLU output under binary cross-entropy,
Adam, batch 5, 100 epochs (here 30)."""
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bugdata as D  # noqa: E402
import harness as H  # noqa: E402

LOSS = "binary_crossentropy"


def model() -> nn.Module:
    return nn.Sequential(H.dense(11, 12, 'normal'), nn.ReLU(), H.dense(12, 12, 'normal'), nn.ReLU(), H.dense(12, 1, 'normal'), nn.ReLU())


def data(seed: int):
    return D.blobs_binary(500, 11, seed, scale=50.0, offset=200.0)


def batch():
    x, y, _, _ = data(0)
    return torch.as_tensor(x[:64], dtype=torch.float32), torch.as_tensor(y[:64], dtype=torch.float32)


def loss(out, target):
    return H.keras_loss(LOSS)(out, target)


def main() -> None:
    a = H.parse(default_epochs=30)
    H.seed_all(a.seed)
    m = model()
    opt, sched = H.optimizer("adam", m.parameters())
    x, y, xv, yv = data(a.seed)
    H.fit(m, LOSS, opt, x, y, epochs=a.epochs, batch_size=5, task="binary", x_val=xv, y_val=yv,
          sched=sched)


if __name__ == "__main__":
    main()
