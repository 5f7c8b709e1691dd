"""AUTOTRAINER Blob, normal run model_random_953b07b0: model_mi_al_19, Adam(lr=0.001), batch 256, 300 epochs."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import blob_models as B  # noqa: E402

LOSS = B.LOSS
batch, loss = B.batch, B.loss


def model():
    return B.model_mi_al_19()


if __name__ == "__main__":
    B.train(B.model_mi_al_19, "adam", 0.001, 256, 300, betas=None)
