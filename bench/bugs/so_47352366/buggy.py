"""StackOverflow 47352366, buggy: MNIST (here digits at 28x28, given flat and reshaped to 1x28x28) with conv
5x5 (32) ReLU, pool, conv 5x5 (64) ReLU, pool, dense 1024 ReLU, dropout 0.5, dense 10 with a
ReLU (not a softmax) under categorical cross-entropy; biases 0.1; Adam; batch 50; 600 steps (22 epochs of the
1347 digits)."""
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bugdata as D  # noqa: E402
import harness as H  # noqa: E402

LOSS = "categorical_crossentropy"


def model() -> nn.Module:
    return nn.Sequential(nn.Unflatten(1, (1, 28, 28)), H.conv2d(1, 32, 5, padding=2, bias_init='const0.1'), nn.ReLU(), nn.MaxPool2d(2), H.conv2d(32, 64, 5, padding=2, bias_init='const0.1'), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), H.dense(7 * 7 * 64, 1024, bias_init='const0.1'), nn.ReLU(), nn.Dropout(0.5), H.dense(1024, 10), nn.ReLU())


def data(seed: int):
    return D.digits(size=28, onehot=True, seed=seed)


def batch():
    x, y, _, _ = data(0)
    return torch.as_tensor(x[:50], dtype=torch.float32), torch.as_tensor(y[:50], dtype=torch.float32)


def loss(out, target):
    return H.keras_loss(LOSS)(out, target)


def main() -> None:
    a = H.parse(default_epochs=10)
    H.seed_all(a.seed)
    m = model()
    opt, sched = H.optimizer("adam", m.parameters())
    x, y, xv, yv = data(a.seed)
    H.fit(m, LOSS, opt, x, y, epochs=a.epochs, batch_size=50, task="categorical", x_val=xv, y_val=yv,
          sched=sched)


if __name__ == "__main__":
    main()
