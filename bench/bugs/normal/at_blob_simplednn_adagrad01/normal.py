"""AUTOTRAINER Blob, normal run config_random_a8640f1a: simplednn_blob, Adagrad(lr=0.1), batch 64, 200 epochs."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import blob_models as B  # noqa: E402

LOSS = B.LOSS
batch, loss = B.batch, B.loss


def model():
    return B.simplednn_blob()


if __name__ == "__main__":
    B.train(B.simplednn_blob, "adagrad", 0.1, 64, 200, betas=None)
