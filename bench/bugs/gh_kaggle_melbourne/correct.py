"""GitHub kaggle-melbourne_properties (price-keras.py), correct: house-price regression on standardised
columns (here a synthetic stand-in), the model built from the --model description '20,20,1' (the default): the same layers; MSE, Adam (Keras defaults), batch 1, 10 epochs
(the default --num_epochs), validation_split 0.2."""
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bugdata as D  # noqa: E402
import harness as H  # noqa: E402

LOSS = "mean_squared_error"


def model() -> nn.Module:
    return nn.Sequential(H.dense(13, 20, 'glorot_normal'), nn.Tanh(), H.dense(20, 20, 'glorot_normal'), nn.Tanh(), H.dense(20, 1))


def data(seed: int):
    return D.housing_like(800, seed)


def batch():
    x, y, _, _ = data(0)
    return torch.as_tensor(x[:64], dtype=torch.float32), torch.as_tensor(y[:64], dtype=torch.float32)


def loss(out, target):
    return H.keras_loss(LOSS)(out, target)


def main() -> None:
    a = H.parse(default_epochs=10)
    H.seed_all(a.seed)
    m = model()
    opt, sched = H.optimizer("adam", m.parameters())
    x, y, xv, yv = data(a.seed)
    H.fit(m, LOSS, opt, x, y, epochs=a.epochs, batch_size=1, task="regression", x_val=xv, y_val=yv,
          sched=sched)


if __name__ == "__main__":
    main()
