"""What doctor's training checks share, handed from check to check as one object instead of loose
arguments."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...results import Result
from .checklist import Checklist


@dataclass
class Probe:
    work: Any                # the working copy the checks train (under torchrun: the wrapped copy's own module)
    inputs: Any              # the batch (ModelInputs)
    ctx: Any                 # the run (core.context.Context)
    loss: Any                # the loss rule of the training checks
    ck: Checklist
    result: Result
    eval_out: Any = None     # the eval forward's output (the modes check compares the train-mode one to it)
    fresh_bn: bool = False   # its BatchNorm statistics were as built when it was made (modes.fresh_statistics)
    scaler: Any = None       # --amp fp16: the GradScaler the backward and the step go through
    wrapped: Any = None      # under torchrun --wrap: wrapped.Wrapped, the copy `work` is the module of
    nonfinite: bool = False  # the train-mode loss is already NaN/Inf: a non-finite update is its consequence
    rng: Any = None          # the global RNG before the train-mode forward: a re-check that replays its draws
