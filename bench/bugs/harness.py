"""What every ported training-bug program shares: Keras' defaults written in torch, and one training loop.

A port keeps the Keras original's architecture, loss, activation, optimizer, learning rate, batch size and
bug. Keras does a few things differently from torch by default; they live here once so each port reads
like its original:

- `dense(n_in, n_out, init)`: Keras' Dense initialisers (glorot_uniform kernel and zero bias by default;
  Keras 1's `init='uniform'` is U(-0.05, 0.05); `'normal'` is N(0, 0.05) as in Keras 2.0-2.2).
- `keras_loss(name)`: Keras' losses on probabilities (cross-entropies clip to [1e-7, 1 - 1e-7] the way
  Keras does; no logits anywhere, as in the originals).
- `optimizer(name, params, lr=None, ...)`: Keras' optimizers with Keras' defaults (and SGD's `decay`:
  lr / (1 + decay * iterations)).
- `fit(...)`: Keras' `model.fit` as a plain torch loop (shuffle each epoch, the last partial batch kept),
  then a held-out evaluation printed as the last line `BUGS_RESULT {json}`.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import time

import numpy as np
import torch
from torch import nn

try:  # watch's hooks for a script (no-ops when no watch is open); the ports also run without torchdiag
    from torchdiag.diagnostics.watch import log, set_epoch
except ImportError:  # pragma: no cover
    def log(*a, **k):
        pass

    def set_epoch(*a, **k):
        pass

EPS = 1e-7          # Keras' backend epsilon
RESULT_TAG = "BUGS_RESULT"


def parse(default_epochs: int) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epochs", type=int, default=default_epochs)
    return p.parse_args()


def seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _init_(w: torch.Tensor, init: str) -> None:
    if init == "glorot_uniform":
        nn.init.xavier_uniform_(w)
    elif init == "glorot_normal":
        nn.init.xavier_normal_(w)
    elif init == "uniform":                 # Keras 1 'uniform': U(-0.05, 0.05)
        nn.init.uniform_(w, -0.05, 0.05)
    elif init == "normal":                  # Keras 2.0-2.2 RandomNormal: N(0, 0.05)
        nn.init.normal_(w, 0.0, 0.05)
    elif init == "he_normal":
        nn.init.kaiming_normal_(w, nonlinearity="relu")
    elif init == "normal1":                 # RandomNormal(stddev=1)
        nn.init.normal_(w, 0.0, 1.0)
    elif init == "const0.1":                # keras.initializers.Constant(0.1)
        nn.init.constant_(w, 0.1)
    elif init == "zeros":
        nn.init.zeros_(w)
    else:
        raise ValueError(f"unknown Keras initialiser {init!r}")


def dense(n_in: int, n_out: int, init: str = "glorot_uniform", bias_init: str = "zeros") -> nn.Linear:
    layer = nn.Linear(n_in, n_out)
    with torch.no_grad():
        _init_(layer.weight, init)
        _init_(layer.bias, bias_init)
    return layer


def conv2d(c_in: int, c_out: int, k: int, init: str = "glorot_uniform", padding: str | int = 0,
           bias_init: str = "zeros", stride: int = 1) -> nn.Conv2d:
    layer = nn.Conv2d(c_in, c_out, k, padding=padding, stride=stride)
    with torch.no_grad():
        _init_(layer.weight, init)
        _init_(layer.bias, bias_init)
    return layer


class Lambda(nn.Module):
    """Keras' Lambda layer for a fixed elementwise map (e.g. p / 255 - 0.5)."""

    def __init__(self, scale: float, shift: float) -> None:
        super().__init__()
        self.scale, self.shift = scale, shift

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale + self.shift


class Softmax1(nn.Softmax):
    """Keras' Activation('softmax'): over the last axis."""

    def __init__(self) -> None:
        super().__init__(dim=-1)


def keras_loss(name: str):
    """Keras' loss on what the model outputs (probabilities for the cross-entropies), mean over the batch."""
    def mse(p, y):
        return ((p - y) ** 2).mean()

    def mae(p, y):
        return (p - y).abs().mean()

    def bce(p, y):
        p = p.clamp(EPS, 1 - EPS)
        return -(y * torch.log(p) + (1 - y) * torch.log(1 - p)).mean()

    def cce(p, y):   # y one-hot; Keras rescales p to sum 1 then clips
        p = p / p.sum(dim=-1, keepdim=True)
        p = p.clamp(EPS, 1 - EPS)
        return -(y * torch.log(p)).sum(dim=-1).mean()

    def scce(p, y):  # y class indices
        p = p / p.sum(dim=-1, keepdim=True)
        p = p.clamp(EPS, 1 - EPS)
        return -torch.log(p.gather(-1, y.long().view(-1, 1))).mean()

    table = {"mean_squared_error": mse, "mse": mse, "mean_absolute_error": mae, "mae": mae,
             "binary_crossentropy": bce, "categorical_crossentropy": cce,
             "sparse_categorical_crossentropy": scce}
    return table[name]


def optimizer(name: str, params, lr: float | None = None, momentum: float = 0.0, nesterov: bool = False,
              decay: float = 0.0):
    """Keras' optimizer `name` with Keras' defaults; returns (optimizer, scheduler or None)."""
    name = name.lower()
    if name == "sgd":
        opt = torch.optim.SGD(params, lr=0.01 if lr is None else lr, momentum=momentum, nesterov=nesterov)
    elif name == "adam":
        opt = torch.optim.Adam(params, lr=0.001 if lr is None else lr, eps=EPS)
    elif name == "rmsprop":
        opt = torch.optim.RMSprop(params, lr=0.001 if lr is None else lr, alpha=0.9, eps=EPS)
    elif name == "adagrad":
        opt = torch.optim.Adagrad(params, lr=0.01 if lr is None else lr, eps=EPS)
    elif name == "adadelta":
        opt = torch.optim.Adadelta(params, lr=1.0 if lr is None else lr, rho=0.95, eps=EPS)
    else:
        raise ValueError(f"unknown Keras optimizer {name!r}")
    sched = None
    if decay:   # Keras' time-based decay, per iteration
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda it: 1.0 / (1.0 + decay * it))
    return opt, sched


def _metric(task: str, p: torch.Tensor, y: torch.Tensor) -> dict:
    if task == "binary":        # Keras' binary accuracy: threshold 0.5, over every output
        return {"acc": float(((p > 0.5).float() == y).float().mean())}
    if task == "categorical":   # one-hot targets
        return {"acc": float((p.argmax(-1) == y.argmax(-1)).float().mean())}
    if task == "sparse":
        return {"acc": float((p.argmax(-1) == y.long().view(-1)).float().mean())}
    if task == "regression":    # an error independent of the training loss, so buggy and correct compare
        return {"mse": float(((p - y) ** 2).mean())}
    raise ValueError(task)


def fit(model: nn.Module, loss_name: str, opt, x, y, *, epochs: int, batch_size: int, task: str,
        x_val=None, y_val=None, sched=None, shuffle: bool = True, y_scale: float = 1.0,
        clipnorm: float | None = None) -> dict:
    """Keras' model.fit as a plain loop; evaluates on (x_val, y_val) and prints the BUGS_RESULT line.

    y_scale: the regression metric is MSE / y_scale^2, so that a script that standardises its targets and
    one that does not report the error in the same units (pass the raw target's standard deviation).
    """
    x = torch.as_tensor(np.asarray(x), dtype=torch.float32)
    y = torch.as_tensor(np.asarray(y), dtype=torch.float32)
    x_val = x if x_val is None else torch.as_tensor(np.asarray(x_val), dtype=torch.float32)
    y_val = y if y_val is None else torch.as_tensor(np.asarray(y_val), dtype=torch.float32)
    loss_fn = keras_loss(loss_name)
    n = len(x)
    steps = 0
    t0, c0 = time.perf_counter(), time.process_time()   # CPU time too: the machine may be shared
    train_loss = float("nan")
    for epoch in range(epochs):
        set_epoch(epoch)
        model.train()
        order = torch.randperm(n) if shuffle else torch.arange(n)
        total = 0.0
        for i in range(0, n, batch_size):
            idx = order[i:i + batch_size]
            loss = loss_fn(model(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            if clipnorm is not None:
                for p in model.parameters():
                    if p.grad is not None:
                        torch.nn.utils.clip_grad_norm_([p], clipnorm)
            opt.step()
            if sched is not None:
                sched.step()
            steps += 1
            total += float(loss.detach()) * len(idx)
        train_loss = total / n
        if epochs <= 50 or epoch % max(1, epochs // 20) == 0 or epoch == epochs - 1:
            val = evaluate(model, loss_fn, x_val, y_val, task)
            log("val_loss", val["loss"])
            if "acc" in val:
                log("val_acc", val["acc"])
    seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - c0
    result = evaluate(model, loss_fn, x_val, y_val, task)
    if "mse" in result:
        result["mse"] = result["mse"] / y_scale ** 2
    result.update(train_loss=train_loss, steps=steps, seconds=round(seconds, 4),
                  cpu_seconds=round(cpu_seconds, 4), epochs=epochs,
                  finite=bool(math.isfinite(result["loss"])))
    print(RESULT_TAG, json.dumps(result), flush=True)
    return result


def evaluate(model: nn.Module, loss_fn, x, y, task: str) -> dict:
    was = model.training
    model.eval()
    with torch.no_grad():
        p = model(x)
        out = {"loss": float(loss_fn(p, y))}
        out.update(_metric(task, p, y))
    model.train(was)
    # NaN outputs give a meaningless accuracy: count them as wrong (Keras does the same via comparisons)
    return {k: (v if math.isfinite(v) else float("nan")) for k, v in out.items()}
