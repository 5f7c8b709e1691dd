"""GitHub MovieReviews_Keras (DeepLocalize's GitHub set), correct: IMDB reviews as 10000-word multi-hot
vectors (here a synthetic stand-in), 10000-16-16-1 ReLU MLP with dropout 0.5 after each hidden layer,
sigmoid output, binary cross-entropy, RMSprop(lr=0.001), batch 512, 7 epochs."""
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bugdata as D  # noqa: E402
import harness as H  # noqa: E402

LOSS = "binary_crossentropy"


def model() -> nn.Module:
    return nn.Sequential(H.dense(10000, 16), nn.ReLU(), nn.Dropout(0.5), H.dense(16, 16), nn.ReLU(), nn.Dropout(0.5), H.dense(16, 1), nn.Sigmoid())


def data(seed: int):
    x, y, _, _, xt, yt = D.bag_of_words(2000, 1000, 1000, seed)
    return x, y, xt, yt


def batch():
    x, y, _, _ = data(0)
    return torch.as_tensor(x[:64], dtype=torch.float32), torch.as_tensor(y[:64], dtype=torch.float32)


def loss(out, target):
    return H.keras_loss(LOSS)(out, target)


def main() -> None:
    a = H.parse(default_epochs=7)
    H.seed_all(a.seed)
    m = model()
    opt, sched = H.optimizer("rmsprop", m.parameters(), lr=0.001)
    x, y, xv, yv = data(a.seed)
    H.fit(m, LOSS, opt, x, y, epochs=a.epochs, batch_size=512, task="binary", x_val=xv, y_val=yv,
          sched=sched)


if __name__ == "__main__":
    main()
