"""GitHub ulmefors/Traffic-Sign-Classifier, correct: 32x32 RGB traffic signs -> 43 classes, p/255 - 0.5,
conv 1x1 (3) -> conv 5x5/2 (16) -> conv 3x3 (32) -> max-pool 2 -> conv 3x3 (64) -> conv 3x3 (128) ->
dropout 0.5 -> dense 128 -> dropout 0.5 -> softmax; sigmoid after the 1x1, ELU after the 5x5 and the first
3x3, ReLU elsewhere; categorical cross-entropy,
Adam(lr=0.001), batch 512, 10 epochs."""
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bugdata_gh as G  # noqa: E402
import harness as H  # noqa: E402

LOSS = "categorical_crossentropy"
ACTS = (nn.Sigmoid, nn.ELU, nn.ELU)   # after the 1x1, the 5x5 and the first 3x3 convolution


class Scale(nn.Module):
    """Keras' Lambda(lambda p: p/255.0 - 0.5)."""

    def forward(self, x):
        return x / 255.0 - 0.5


def model() -> nn.Module:
    c2 = H.conv2d(3, 16, 5)
    c2.stride = (2, 2)
    return nn.Sequential(Scale(), H.conv2d(3, 3, 1), ACTS[0](), c2, ACTS[1](), H.conv2d(16, 32, 3), ACTS[2](),
                         nn.MaxPool2d(2, 2), H.conv2d(32, 64, 3), nn.ReLU(), H.conv2d(64, 128, 3), nn.ReLU(),
                         nn.Flatten(), nn.Dropout(0.5), H.dense(512, 128), nn.ReLU(), nn.Dropout(0.5),
                         H.dense(128, 43), H.Softmax1())


def data(seed: int):
    return G.traffic_signs(seed)


def batch():
    x, y, _, _ = G.traffic_signs(0, per_class=2)
    return torch.as_tensor(x[:64]), torch.as_tensor(y[:64])


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
