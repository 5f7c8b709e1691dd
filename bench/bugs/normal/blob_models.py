"""AUTOTRAINER's Blob models and training configs that DeepDiagnosis (ICSE 2022) publishes as normal.

Source: github.com/DeepDiagnosis/ICSE2022 @ 500b0176, 'AUTOTRAINER Model Code/Models_Blob.py' (the Keras
models) and 'difference threshold/Blob_normal/<run>/config_*.pkl' (each run's optimizer, lr, batch size,
epochs). Data as AUTOTRAINER's data/simplednn.py builds it: sklearn's make_blobs(1000, 3 centres, 2
features, std 2, random_state=2) * 100, the first 700 rows train, the last 300 validate, one-hot labels.
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import harness as H  # noqa: E402

LOSS = "categorical_crossentropy"


def blobs():
    """simplednn.load_data('blob'): the same rows for every seed (random_state=2), as the original."""
    from sklearn.datasets import make_blobs
    x, y = make_blobs(n_samples=1000, centers=3, n_features=2, cluster_std=2, random_state=2)
    x = (x * 100).astype(np.float32)
    y = np.eye(3, dtype=np.float32)[y]
    return x[:700], y[:700], x[700:], y[700:]


def he_uniform_dense(n_in: int, n_out: int) -> nn.Linear:
    """Dense with VarianceScaling(scale=2, fan_in, uniform) kernel, zero bias."""
    layer = nn.Linear(n_in, n_out)
    with torch.no_grad():
        nn.init.kaiming_uniform_(layer.weight, nonlinearity="relu")   # bound sqrt(6 / fan_in), as Keras'
        layer.bias.zero_()
    return layer


def tanh_stack(n_dense: int, extra_tanh_after: int | None = None) -> list[nn.Module]:
    """n_dense Dense(5) layers each followed by tanh (2 inputs); a second tanh after dense number
    extra_tanh_after (1-based) where the Keras model stacks two Activation('tanh') layers."""
    layers: list[nn.Module] = []
    n_in = 2
    for i in range(1, n_dense + 1):
        layers += [he_uniform_dense(n_in, 5), nn.Tanh()]
        if i == extra_tanh_after:
            layers.append(nn.Tanh())
        n_in = 5
    return layers


def simplednn_blob() -> nn.Module:
    """Models_Blob.py 'simplednn_blob': 5 x (Dense 5, tanh), Dense 3 sigmoid."""
    return nn.Sequential(*tanh_stack(5), he_uniform_dense(5, 3), nn.Sigmoid())


def model_al_19() -> nn.Module:
    """Models_Blob.py 'model_al_19': 17 x (Dense 5, tanh) with tanh applied twice after the 14th,
    Dense 3 sigmoid."""
    return nn.Sequential(*tanh_stack(17, extra_tanh_after=14), he_uniform_dense(5, 3), nn.Sigmoid())


def model_mi_al_19() -> nn.Module:
    """Models_Blob.py 'model_mi_al_19': 18 x (Dense 5, tanh), Dense 3 sigmoid whose kernel is
    VarianceScaling(1, fan_in, normal) and bias VarianceScaling(1, fan_avg, normal) (Keras 2.2: truncated
    normal, std sqrt(scale / fan); a bias of shape (3,) has fan_in = fan_out = 3)."""
    last = nn.Linear(5, 3)
    with torch.no_grad():
        std_w, std_b = math.sqrt(1 / 5), math.sqrt(1 / 3)
        nn.init.trunc_normal_(last.weight, 0.0, std_w, -2 * std_w, 2 * std_w)
        nn.init.trunc_normal_(last.bias, 0.0, std_b, -2 * std_b, 2 * std_b)
    return nn.Sequential(*tanh_stack(18), last, nn.Sigmoid())


def optimizer(name: str, params, lr: float, betas: tuple[float, float] | None = None):
    """The config's Keras optimizer (Adam's beta_1/beta_2 from opt_kwargs when given)."""
    if name == "adam" and betas is not None:
        return torch.optim.Adam(params, lr=lr, betas=betas, eps=H.EPS), None
    return H.optimizer(name, params, lr=lr)


def batch():
    x, y, _, _ = blobs()
    return torch.as_tensor(x[:64]), torch.as_tensor(y[:64])


def loss(out, target):
    return H.keras_loss(LOSS)(out, target)


def train(build, opt_name: str, lr: float, batch_size: int, epochs: int, betas=None) -> None:
    a = H.parse(default_epochs=epochs)
    H.seed_all(a.seed)
    m = build()
    opt, sched = optimizer(opt_name, m.parameters(), lr, betas)
    x, y, xv, yv = blobs()
    H.fit(m, LOSS, opt, x, y, epochs=a.epochs, batch_size=batch_size, task="categorical", x_val=xv, y_val=yv,
          sched=sched)
