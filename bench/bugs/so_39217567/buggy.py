"""StackOverflow 39217567, buggy: the 256 8-bit codes mapped to a random permutation of themselves,
8-8-8-8 sigmoid MLP (init 'normal'), MSE, SGD (Keras default lr 0.01), batch 50, 1000 epochs."""
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bugdata as D  # noqa: E402
import harness as H  # noqa: E402

LOSS = "mse"


def model() -> nn.Module:
    return nn.Sequential(H.dense(8, 8, 'normal'), nn.Sigmoid(), H.dense(8, 8, 'normal'), nn.Sigmoid(), H.dense(8, 8, 'normal'), nn.Sigmoid())


def data(seed: int):
    return D.binary_codes(8, seed, shuffle_targets=True)


def batch():
    x, y, _, _ = data(0)
    return torch.as_tensor(x[:64], dtype=torch.float32), torch.as_tensor(y[:64], dtype=torch.float32)


def loss(out, target):
    return H.keras_loss(LOSS)(out, target)


def main() -> None:
    a = H.parse(default_epochs=1000)
    H.seed_all(a.seed)
    m = model()
    opt, sched = H.optimizer("sgd", m.parameters())
    x, y, xv, yv = data(a.seed)
    H.fit(m, LOSS, opt, x, y, epochs=a.epochs, batch_size=50, task="binary", x_val=xv, y_val=yv,
          sched=sched)


if __name__ == "__main__":
    main()
