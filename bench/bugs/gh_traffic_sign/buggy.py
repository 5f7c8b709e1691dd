"""GitHub Traffic-Sign-Classifier, buggy: 43-class 32x32 RGB signs (here a synthetic stand-in), Lambda p/255-0.5,
conv 1x1 (3) nn.ReLU(), conv 5x5/2 (16) nn.ReLU(), conv 3x3 (32) nn.ReLU(), max-pool, conv 3x3 (64) ReLU, conv 3x3 (128) ReLU,
dropout 0.5, dense 128 ReLU, dropout 0.5, softmax; categorical cross-entropy, Adam(lr=0.001), batch 512, 10 epochs."""
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import datasets as D  # noqa: E402
import harness as H  # noqa: E402

LOSS = "categorical_crossentropy"


def model() -> nn.Module:
    return nn.Sequential(H.Lambda(1 / 255.0, -0.5), H.conv2d(3, 3, 1), nn.ReLU(), H.conv2d(3, 16, 5, stride=2), nn.ReLU(), H.conv2d(16, 32, 3), nn.ReLU(), nn.MaxPool2d(2, 2), H.conv2d(32, 64, 3), nn.ReLU(), H.conv2d(64, 128, 3), nn.ReLU(), nn.Flatten(), nn.Dropout(0.5), H.dense(128 * 2 * 2, 128), nn.ReLU(), nn.Dropout(0.5), H.dense(128, 43), H.Softmax1())


def data(seed: int):
    return D.class_templates(2500, 43, seed)


def batch():
    x, y, _, _ = data(0)
    return torch.as_tensor(x[:64], dtype=torch.float32), torch.as_tensor(y[:64], dtype=torch.float32)


def loss(out, target):
    return H.keras_loss(LOSS)(out, target)


def main() -> None:
    a = H.parse(default_epochs=10)
    H.seed_all(a.seed)
    m = model()
    opt, sched = H.optimizer("adam", m.parameters(), lr=0.001)
    x, y, xv, yv = data(a.seed)
    H.fit(m, LOSS, opt, x, y, epochs=a.epochs, batch_size=512, task="categorical", x_val=xv, y_val=yv,
          sched=sched)


if __name__ == "__main__":
    main()
