"""AUTOTRAINER Blob, normal run double_random_54f7ba3b: model_mi_al_19, Adam(lr=0.001, beta_1=0.3897,
beta_2=0.4435), batch 256, 400 epochs."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import blob_models as B  # noqa: E402

LOSS = B.LOSS
batch, loss = B.batch, B.loss


def model():
    return B.model_mi_al_19()


if __name__ == "__main__":
    B.train(B.model_mi_al_19, "adam", 0.001, 256, 400, betas=(0.3897, 0.4435))
