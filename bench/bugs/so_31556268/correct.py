"""StackOverflow 31556268, correct: the same 2-4-1 sigmoid MLP, mean squared error, Adam (Keras defaults),
batch 4, 10000 epochs."""
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bugdata as D  # noqa: E402
import harness as H  # noqa: E402

LOSS = "mse"


def model() -> nn.Module:
    return nn.Sequential(H.dense(2, 4), nn.Sigmoid(), H.dense(4, 1), nn.Sigmoid())


def batch():
    x, y = D.xor4()
    return torch.tensor(x), torch.tensor(y)


def loss(out, target):
    return H.keras_loss(LOSS)(out, target)


def main() -> None:
    a = H.parse(default_epochs=3000)
    H.seed_all(a.seed)
    m = model()
    opt, sched = H.optimizer("adam", m.parameters())
    x, y = D.xor4()
    H.fit(m, LOSS, opt, x, y, epochs=a.epochs, batch_size=4, task="binary", sched=sched)


if __name__ == "__main__":
    main()
