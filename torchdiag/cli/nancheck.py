"""`torchdiag nancheck`: where NaN/Inf first appear — inputs, parameters, forward, loss, backward, steps."""
from __future__ import annotations

from typing import Annotated

import typer

from . import common as c

EXAMPLE = """Examples:

  torchdiag nancheck sample_models/broken_nan_forward.py:build

  torchdiag nancheck sample_models/mlp.py:build -i 16x784 --json

  torchdiag nancheck sample_models/broken_nan_backward.py:build --anomaly

  torchdiag nancheck sample_models/broken_nan_after_steps.py:build --steps 30 --lr 0.01 --optimizer sgd

  torchdiag nancheck sample_models/precision.py:overflow --dtype float16

  torchdiag nancheck sample_models/precision.py:overflow --amp fp16 --steps 3

Exit codes: 0 all finite · 1 NaN/Inf found · 2 usage error · 3 the model raised · 4 internal error."""

DETAILS = """Names the first module whose output is non-finite while its inputs were finite (NaN/Inf counts,
input range), and the first module whose input gradient turns non-finite while the gradient at
its output was finite. One forward+backward in train mode; the model is left as it was
(parameters, buffers, grads, flags, RNG). Exit 1 when anything is non-finite.

With --dtype bfloat16|float16 or --amp bf16|fp16 it also says why in precision terms: a float32
reference (same weights and inputs) tells an overflow of the dtype from a NaN that is there in
float32 too; warnings for values within 8x of the dtype's largest finite value and for gradients
that are nonzero in float32 but below the reduced dtype's range, 0 there (underflow; zeros from
rounding are counted apart). --steps with --amp fp16 runs a
GradScaler and reports its scale per step and the steps it skipped."""

OWN = {
    "steps": (Annotated[int, typer.Option("--steps", help="Also run N ≥ 0 optimizer steps on a copy of the model, same batch, and report where values first go non-finite.")], 0),
    "lr": (Annotated[float, typer.Option("--lr", help="Learning rate for --steps.")], 0.01),
    "optimizer": (Annotated[str, typer.Option("--optimizer", help="sgd|adam|adamw, for --steps.")], "sgd"),
    "momentum": (c.momentum("0 (plain SGD)"), None),
    "anomaly": (Annotated[bool, typer.Option("--anomaly", help="Also run under autograd anomaly detection and show the forward trace of the failing op (anomaly mode costs 1.2-1.5x a forward+backward at real model sizes, more on tiny models).")], False),
}


def run(o) -> None:
    from ..diagnostics import nancheck as diag

    c.execute(c.job("nancheck", o, optimizer=dict(name=o.optimizer, lr=o.lr, momentum=o.momentum),
                    options=lambda: diag.Options(steps=o.steps, anomaly=o.anomaly)))


def register(app) -> None:
    c.register(app, "nancheck", run, OWN, DETAILS, EXAMPLE)
