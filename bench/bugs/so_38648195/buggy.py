"""StackOverflow 38648195, buggy: multi-label classification (3 labels, 20 features), 20-20-3 ReLU
MLP with dropout 0.5, softmax output trained with mean squared error on multi-label targets, SGD (Keras default lr 0.01), batch 20, 20 epochs."""
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bugdata as D  # noqa: E402
import harness as H  # noqa: E402

LOSS = "mean_squared_error"


def model() -> nn.Module:
    return nn.Sequential(H.dense(20, 20), nn.ReLU(), nn.Dropout(0.5), H.dense(20, 20), nn.ReLU(), nn.Dropout(0.5), H.dense(20, 3), H.Softmax1())


def data(seed: int):
    return D.multilabel(6000, 20, 3, seed)


def batch():
    x, y, _, _ = data(0)
    return torch.as_tensor(x[:64], dtype=torch.float32), torch.as_tensor(y[:64], dtype=torch.float32)


def loss(out, target):
    return H.keras_loss(LOSS)(out, target)


def main() -> None:
    a = H.parse(default_epochs=10)
    H.seed_all(a.seed)
    m = model()
    opt, sched = H.optimizer("sgd", m.parameters())
    x, y, xv, yv = data(a.seed)
    H.fit(m, LOSS, opt, x, y, epochs=a.epochs, batch_size=20, task="binary", x_val=xv, y_val=yv,
          sched=sched)


if __name__ == "__main__":
    main()
