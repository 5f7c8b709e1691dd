"""StackOverflow 48385830, correct: a sigmoid hidden layer, a softmax output and categorical
cross-entropy; the same N(0, 1) init, SGD(lr=3.0), batch 10, 30 epochs."""
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bugdata as D  # noqa: E402
import harness as H  # noqa: E402

LOSS = "categorical_crossentropy"


def model() -> nn.Module:
    return nn.Sequential(H.dense(784, 30, 'normal1', 'normal1'), nn.Sigmoid(), H.dense(30, 10, 'normal1', 'normal1'), H.Softmax1())


def data(seed: int):
    return D.digits(size=28, onehot=True, seed=seed)


def batch():
    x, y, _, _ = data(0)
    return torch.as_tensor(x[:64], dtype=torch.float32), torch.as_tensor(y[:64], dtype=torch.float32)


def loss(out, target):
    return H.keras_loss(LOSS)(out, target)


def main() -> None:
    a = H.parse(default_epochs=20)
    H.seed_all(a.seed)
    m = model()
    opt, sched = H.optimizer("sgd", m.parameters(), lr=3.0)
    x, y, xv, yv = data(a.seed)
    H.fit(m, LOSS, opt, x, y, epochs=a.epochs, batch_size=10, task="categorical", x_val=xv, y_val=yv,
          sched=sched)


if __name__ == "__main__":
    main()
