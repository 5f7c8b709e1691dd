"""StackOverflow 45442843, correct: the feature scaled, a sigmoid output with binary cross-entropy,
RMSprop, batch 200, 100 epochs."""
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bugdata as D  # noqa: E402
import harness as H  # noqa: E402

LOSS = "binary_crossentropy"


def model() -> nn.Module:
    return nn.Sequential(H.dense(1, 1), nn.Sigmoid(), H.dense(1, 1, 'normal'), nn.Sigmoid())


def data(seed: int):
    return D.scaled(D.one_feature(1000, seed))


def batch():
    x, y, _, _ = data(0)
    return torch.as_tensor(x[:64], dtype=torch.float32), torch.as_tensor(y[:64], dtype=torch.float32)


def loss(out, target):
    return H.keras_loss(LOSS)(out, target)


def main() -> None:
    a = H.parse(default_epochs=100)
    H.seed_all(a.seed)
    m = model()
    opt, sched = H.optimizer("rmsprop", m.parameters())
    x, y, xv, yv = data(a.seed)
    H.fit(m, LOSS, opt, x, y, epochs=a.epochs, batch_size=200, task="binary", x_val=xv, y_val=yv,
          sched=sched)


if __name__ == "__main__":
    main()
