"""GitHub eangelou/kerasma, buggy: Pima diabetes' 8 raw columns -> onset, 8-12-8-1 ReLU MLP with a sigmoid
output, binary cross-entropy, Adam, batch 10, 150 epochs."""
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bugdata_gh as G  # noqa: E402
import harness as H  # noqa: E402

LOSS = "binary_crossentropy"


def model() -> nn.Module:
    return nn.Sequential(H.dense(8, 12), nn.ReLU(), H.dense(12, 8), nn.ReLU(), H.dense(8, 1), nn.Sigmoid())


def data(seed: int):
    return G.pima_like(seed)


def batch():
    x, y, _, _ = data(0)
    return torch.as_tensor(x[:64]), torch.as_tensor(y[:64])


def loss(out, target):
    return H.keras_loss(LOSS)(out, target)


def main() -> None:
    a = H.parse(default_epochs=150)
    H.seed_all(a.seed)
    m = model()
    opt, sched = H.optimizer("adam", m.parameters())
    x, y, xv, yv = data(a.seed)
    H.fit(m, LOSS, opt, x, y, epochs=a.epochs, batch_size=10, task="binary", x_val=xv, y_val=yv, sched=sched)


if __name__ == "__main__":
    main()
