"""GitHub ShyamPoovaiah/FacialKeypointsDetection (src/1_single_hidden_layer.py), buggy: 96x96 grey faces
(flattened, 9216) -> the 30 keypoint coordinates, Dense 50 -> 100 -> 30 with no activation, MSE,
Adam(lr=0.1), batch 32 (Keras' default), 100 epochs (20 here)."""
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bugdata_gh as G  # noqa: E402
import harness as H  # noqa: E402

LOSS = "mean_squared_error"


def model() -> nn.Module:
    return nn.Sequential(H.dense(9216, 50), H.dense(50, 100), H.dense(100, 30))


def data(seed: int):
    return G.face_keypoints(seed)


def batch():
    x, y, _, _ = data(0)
    return torch.as_tensor(x[:64]), torch.as_tensor(y[:64])


def loss(out, target):
    return H.keras_loss(LOSS)(out, target)


def main() -> None:
    a = H.parse(default_epochs=20)
    H.seed_all(a.seed)
    m = model()
    opt, sched = H.optimizer("adam", m.parameters(), lr=0.1)
    x, y, xv, yv = data(a.seed)
    H.fit(m, LOSS, opt, x, y, epochs=a.epochs, batch_size=32, task="regression", x_val=xv, y_val=yv,
          sched=sched)


if __name__ == "__main__":
    main()
