"""StackOverflow 39525358, buggy: binary classification of 3 raw (unscaled) features, 3-12-3-1 ReLU
MLP (init 'uniform') with a sigmoid output, binary cross-entropy, Adam, batch 1, 150 epochs (here 50)."""
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bugdata as D  # noqa: E402
import harness as H  # noqa: E402

LOSS = "binary_crossentropy"


def model() -> nn.Module:
    return nn.Sequential(H.dense(3, 12, 'uniform'), nn.ReLU(), H.dense(12, 3, 'uniform'), nn.ReLU(), H.dense(3, 1, 'uniform'), nn.Sigmoid())


def data(seed: int):
    return D.blobs_binary(300, 3, seed, scale=100.0, offset=500.0, test_size=0.33)


def batch():
    x, y, _, _ = data(0)
    return torch.as_tensor(x[:64], dtype=torch.float32), torch.as_tensor(y[:64], dtype=torch.float32)


def loss(out, target):
    return H.keras_loss(LOSS)(out, target)


def main() -> None:
    a = H.parse(default_epochs=15)
    H.seed_all(a.seed)
    m = model()
    opt, sched = H.optimizer("adam", m.parameters())
    x, y, xv, yv = data(a.seed)
    H.fit(m, LOSS, opt, x, y, epochs=a.epochs, batch_size=1, task="binary", x_val=xv, y_val=yv,
          sched=sched)


if __name__ == "__main__":
    main()
