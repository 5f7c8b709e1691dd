"""StackOverflow 45337371, correct: 5 features, 5-60-50-1 ReLU MLP with a sigmoid output,
binary cross-entropy, Adam. The post never calls fit (it asks why the input gradient is zero); the port
trains with Keras' fit defaults (batch 32) for 20 epochs on a learnable binary stand-in."""
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bugdata as D  # noqa: E402
import harness as H  # noqa: E402

LOSS = "binary_crossentropy"


def model() -> nn.Module:
    return nn.Sequential(H.dense(5, 60), nn.ReLU(), H.dense(60, 50), nn.ReLU(), H.dense(50, 1), nn.Sigmoid())


def data(seed: int):
    return D.blobs_binary(1000, 5, seed)


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
    H.fit(m, LOSS, opt, x, y, epochs=a.epochs, batch_size=32, task="binary", x_val=xv, y_val=yv,
          sched=sched)


if __name__ == "__main__":
    main()
