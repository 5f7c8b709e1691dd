"""StackOverflow 31880720, buggy: rows of 128 ones (label 1) or zeros (label 0), 128-50-50-1 ReLU
MLP (a second ReLU stacked on the first) with dropout 0.2 and a softmax over one output unit, binary
cross-entropy, RMSprop, batch 1, 3 epochs."""
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bugdata as D  # noqa: E402
import harness as H  # noqa: E402

LOSS = "binary_crossentropy"


def model() -> nn.Module:
    return nn.Sequential(H.dense(128, 50), nn.ReLU(), nn.ReLU(), nn.Dropout(0.2), H.dense(50, 50), nn.ReLU(), nn.Dropout(0.2), H.dense(50, 1), H.Softmax1())


def data(seed: int):
    return D.constant_rows(1000, 100)


def batch():
    x, y, _, _ = data(0)
    return torch.as_tensor(x[:64], dtype=torch.float32), torch.as_tensor(y[:64], dtype=torch.float32)


def loss(out, target):
    return H.keras_loss(LOSS)(out, target)


def main() -> None:
    a = H.parse(default_epochs=3)
    H.seed_all(a.seed)
    m = model()
    opt, sched = H.optimizer("rmsprop", m.parameters())
    x, y, xv, yv = data(a.seed)
    H.fit(m, LOSS, opt, x, y, epochs=a.epochs, batch_size=1, task="binary", x_val=xv, y_val=yv,
          sched=sched)


if __name__ == "__main__":
    main()
