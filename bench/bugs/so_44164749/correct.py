"""StackOverflow 44164749, correct: the same MLP with sigmoid outputs and binary cross-entropy
(the accepted answer), same optimizer, batch 2000, 5 epochs."""
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bugdata as D  # noqa: E402
import harness as H  # noqa: E402

LOSS = "binary_crossentropy"


def model() -> nn.Module:
    return nn.Sequential(H.dense(784, 5000), nn.ReLU(), nn.Dropout(0.1), H.dense(5000, 600), nn.ReLU(), nn.Dropout(0.1), H.dense(600, 10), nn.Sigmoid())


def data(seed: int):
    return D.digits(size=28, onehot=True, seed=seed)


def batch():
    x, y, _, _ = data(0)
    return torch.as_tensor(x[:64], dtype=torch.float32), torch.as_tensor(y[:64], dtype=torch.float32)


def loss(out, target):
    return H.keras_loss(LOSS)(out, target)


def main() -> None:
    a = H.parse(default_epochs=5)
    H.seed_all(a.seed)
    m = model()
    opt, sched = H.optimizer("sgd", m.parameters(), lr=0.01, momentum=0.9, nesterov=True, decay=1e-6)
    x, y, xv, yv = data(a.seed)
    H.fit(m, LOSS, opt, x, y, epochs=a.epochs, batch_size=2000, task="categorical", x_val=xv, y_val=yv,
          sched=sched)


if __name__ == "__main__":
    main()
