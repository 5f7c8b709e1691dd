"""StackOverflow 34311586, buggy: XOR (6 rows) with a 2-2-3-1 sigmoid MLP whose last activation is a
softmax over one unit (always 1.0), init 'uniform', MSE, SGD(lr=0.001, momentum=0.9, nesterov,
decay=1e-6), Keras' default batch 32, 20 epochs."""
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bugdata as D  # noqa: E402
import harness as H  # noqa: E402

LOSS = "mean_squared_error"


def model() -> nn.Module:
    return nn.Sequential(H.dense(2, 2, "uniform"), nn.Sigmoid(), H.dense(2, 3, "uniform"), nn.Sigmoid(),
                         H.dense(3, 1, "uniform"), H.Softmax1())


def batch():
    x, y = D.xor6()
    return torch.tensor(x), torch.tensor(y)


def loss(out, target):
    return H.keras_loss(LOSS)(out, target)


def main() -> None:
    a = H.parse(default_epochs=20)
    H.seed_all(a.seed)
    m = model()
    opt, sched = H.optimizer("sgd", m.parameters(), lr=0.001, momentum=0.9, nesterov=True, decay=1e-6)
    x, y = D.xor6()
    H.fit(m, LOSS, opt, x, y, epochs=a.epochs, batch_size=32, task="binary", sched=sched)


if __name__ == "__main__":
    main()
