"""overfit-batch: can this model memorise one fixed batch?

A COPY of the model (`ctx.train_copy`, train mode) is trained on one batch with the loss rules of
core/loss.py. Step k evaluates the loss (``loss[k]``); when the target is reached, the budget is
spent or the loss is non-finite the run stops, otherwise one backward and one optimizer step follow.
So ``loss`` has ``steps + 1`` entries: ``loss[0]`` is the initial loss, ``loss[-1]`` the loss after
the last update; ``grad_norm``/``learning_rate`` have one entry per update.

Pass: ``final ≤ target_ratio × initial`` (and batch accuracy 100% when the loss is cross-entropy),
or ``final ≤ target_loss``. On failure the likely causes are checked on the trained copy:
non-finite loss, parameters without gradients, parameters that never changed, a loss flat from the
start, outputs identical across the samples of the batch (and the first module that makes them so),
outputs squashed into [0, 1] or [-1, 1] where cross-entropy needs logits (the target then lies below
the lowest reachable loss).
Ctrl-C inside the loop returns the partial result with ``interrupted: true`` (exit 130).

Layout: `loop` trains and records the curve, `causes` checks what went wrong on the trained copy,
`report` turns both into the Result. The optimizer, learning rate, seed and autocast come from the
run spec (`ctx`); the options here are overfit-batch's own.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ...core.run import DEFAULT_LR, OptimizerSpec, number
from ...errors import OptionError

NEEDS_VALUES = True
# under torchrun: how each --wrap reaches this command (cli/torchrun.py: wrap_mode)
WRAP = {"ddp": ("train", "the copy overfit-batch trains; its stop is agreed across ranks each step, the causes "
                         "are checked on a local copy"),
        "fsdp": ("train", "the copy overfit-batch trains is sharded by fully_shard; each rank's loss is on its own "
                          "rows, the stop is agreed across ranks each step, the causes are checked on a local copy "
                          "of the gathered weights")}
OPTIMIZER = OptimizerSpec("adam")     # lr None: DEFAULT_LR (adam/adamw 1e-3, sgd 1e-2); sgd momentum 0.9
RATIO_HINT = "e.g. 0.01: pass when the loss falls to 1% of its initial value"

__all__ = ["Options", "run", "NEEDS_VALUES", "OPTIMIZER", "WRAP", "DEFAULT_LR", "same_across_samples", "accuracy",
           "entropy_floor", "output_box", "bounded_floor", "find_collapse"]


@dataclass
class Options:
    """overfit-batch's own options (the names of its pyproject keys, with _ for -). Validated here,
    before any model is loaded, for every caller (CLI, Python, `check`)."""

    steps: int = 500
    target_ratio: float = 0.01
    target_loss: float | None = None
    max_names: int = 10
    # Progress callback (step, loss) after each loss evaluation: plain Python, holds no torch state,
    # so it stays an option (the CLI's live bar uses it).
    on_step: Callable[[int, float], None] | None = None

    def __post_init__(self):
        number("steps", self.steps, low=1, integer=True)
        number("target_ratio", self.target_ratio)
        if not 0 < self.target_ratio < 1:
            raise OptionError("target_ratio", f"must be between 0 and 1, got {self.target_ratio!r}", hint=RATIO_HINT)
        if self.target_loss is not None:
            number("target_loss", self.target_loss)
        number("max_names", self.max_names, low=1, integer=True)
        if self.on_step is not None and not callable(self.on_step):
            raise OptionError("on_step", f"{self.on_step!r} is not callable", hint="fn(step, loss) or None")


def run(model, inputs, opts: Options | None, ctx):
    """Train a copy of `model` on one batch; the Result holds the curve, the verdict and the causes."""
    from ...core.guard import leave_no_trace
    from .causes import diagnose
    from .loop import Trainer
    from .report import build

    opts = opts or Options()
    with leave_no_trace(model), ctx.seeded():
        trainer = Trainer(ctx.train_copy(model), inputs.clone(), ctx.loss(), opts, ctx)
        curve = trainer.train()
        if ctx.wrapper is not None and curve.interrupted:   # no verdict, and no collective: a peer may be gone
            from .causes import Causes

            found = Causes([], [])
        else:
            if ctx.wrapper is not None:   # under torchrun: the causes' extra passes on a local copy (no collective)
                from .sharded import localise

                localise(trainer, model, "to check the causes on this rank")
            found = diagnose(trainer, curve, opts)
    return build(trainer, curve, found, opts, ctx)
