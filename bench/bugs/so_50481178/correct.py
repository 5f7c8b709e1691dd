"""StackOverflow 50481178, correct: the same MLP ending in a 2-way softmax with sparse categorical
cross-entropy, Adam, batch 10, 50 epochs."""
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bugdata as D  # noqa: E402
import harness as H  # noqa: E402

LOSS = "sparse_categorical_crossentropy"


def model() -> nn.Module:
    return nn.Sequential(H.dense(4, 10), nn.ReLU(), H.dense(10, 20), nn.ReLU(), H.dense(20, 30), nn.ReLU(), H.dense(30, 40), nn.ReLU(), H.dense(40, 50), nn.ReLU(), H.dense(50, 2), H.Softmax1())


def data(seed: int):
    return D.binary_multilabel(1000, 4, seed, flat=True)


def batch():
    x, y, _, _ = data(0)
    return torch.as_tensor(x[:64], dtype=torch.float32), torch.as_tensor(y[:64], dtype=torch.float32)


def loss(out, target):
    return H.keras_loss(LOSS)(out, target)


def main() -> None:
    a = H.parse(default_epochs=20)
    H.seed_all(a.seed)
    m = model()
    opt, sched = H.optimizer("adam", m.parameters())
    x, y, xv, yv = data(a.seed)
    H.fit(m, LOSS, opt, x, y, epochs=a.epochs, batch_size=10, task="sparse", x_val=xv, y_val=yv,
          sched=sched)


if __name__ == "__main__":
    main()
