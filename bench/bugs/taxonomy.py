"""torchdiag's finding codes mapped onto the DeepFD fault-type taxonomy (Evaluation.xlsx, column D).

Decided from what each code says about the training run (its message and hint in the docs), before the
benchmark was run and never adjusted to its results. A code names a fault type only when its mechanism
points there; a code whose cause could be anything (e.g. `cannot-overfit`: "could not memorise one batch")
names none: it counts as a detection, not as a diagnosis. A code mapped to several types is diagnosed
when any of them is in the ground truth (DeepFD's own output names several types too).

DeepFD's types: act (activation), loss, lr, opt (optimizer), init, epoch, batch_size, missing_prep
(input not normalised), wrong_prep, training_data_quality, layer_properties,
missing/redundant/wrong_layers, model_type&properties, origin (the post's problem is elsewhere).
"""
from __future__ import annotations

CODES: dict[str, tuple[str, ...]] = {
    # the step size: divergence, overshoot, updates too large or too small for the weights
    "lr-too-high": ("lr",), "lr-too-low": ("lr",), "lr-unstable": ("lr",), "no-rate-trains": ("lr",),
    "loss-diverged": ("lr",), "loss-spike": ("lr",), "grad-norm-explosion": ("lr",),
    "exploding-grad": ("lr",), "update-ratio-high": ("lr",), "update-ratio-low": ("lr",),
    "non-finite-parameter": ("lr",), "non-finite-update": ("lr",), "non-finite-param": ("lr",),
    "non-finite-bn-stats": ("lr",), "diverges-above": ("lr",),
    # a NaN/Inf loss or gradient: a step that blew up (lr) or a loss outside its domain (log 0)
    "non-finite-loss": ("lr", "loss"), "non-finite-gradient": ("lr", "loss"), "non-finite-grad": ("lr", "loss"),
    "non-finite-param-grad": ("lr", "loss"), "non-finite-output": ("lr", "act"),
    "non-finite-activation": ("lr", "act"),
    # what the activations do: dead ReLUs, saturation, vanishing gradient, outputs squashed or collapsed
    "dead-units": ("act",), "dead-activations": ("act",), "saturated-activations": ("act",),
    "stranded-samples": ("act", "init"),       # samples a dead activation cuts off (its units off: init or act)
    "saturated": ("act",),                      # gradflow's name for saturated tanh/sigmoid outputs
    "vanishing-grad": ("act", "init"), "identical-outputs": ("act",),
    "bounded-output": ("act", "loss"),          # a final sigmoid/softmax that the loss cannot work with
    "made-target-nonnegative": ("act",),        # cross-entropy over an output >= 0: an activation after the last layer
    "loss-ignores-parameters": ("act", "loss"),  # every gradient exactly 0: a constant output or a loss on the wrong tensor
    "zero-grad": ("act", "init"),               # a parameter whose gradient is exactly zero
    "flat-loss": ("lr", "act"),                 # no step size moves the loss: too small or nothing flows
    # the loss and the targets do not fit the output
    "target-out-of-range": ("loss",), "labels-out-of-range": ("loss", "wrong_prep"),
    # the optimizer is wired wrongly (what it steps, what it zeroes)
    "not-in-optimizer": ("opt",), "grad-carried-over": ("opt",), "grad-from-other-loss": ("opt",), "param-not-updated": ("opt",),
    "unchanged-params": ("opt",), "never-changes": ("opt",), "never-gets-grad": ("opt",), "optimizer-idle": ("opt",),
    "optimizer-cannot-fit": ("opt", "lr"),      # the default optimizer memorises the batch the run's cannot
    "lr-too-large": ("lr",),                    # a tenth of the rate memorises the batch the run collapsed on
    "loss-rose": ("lr", "loss"),                # the steps raise the loss: a rate too large, or a gradient's sign
    "maximize-on-loss": ("loss", "opt"), "negated-loss": ("loss",),   # the steps climb torch's own loss by design
    "gradients-stopped": ("opt", "act"),        # stepping over parameters the loss stopped reaching (a model replaced
                                                # after its optimizer was built), or whose gradients are all 0 (dead units)
    # initialisation
    "zero-init": ("init",),
    # the input is not preprocessed
    "unnormalised-input": ("missing_prep",), "not-standardised": ("missing_prep",),
    "raw-pixels": ("missing_prep",), "non-finite-input": ("wrong_prep",), "constant-input": ("wrong_prep",),
    "non-finite": ("wrong_prep",),              # data: samples holding NaN/Inf
    # the data itself
    "single-class": ("training_data_quality",), "class-imbalance": ("training_data_quality",),
    "classes-absent": ("training_data_quality",), "duplicate-samples": ("training_data_quality",),
    "train-val-overlap": ("training_data_quality",), "not-shuffled": ("wrong_prep",),
    # batch size
    "batchnorm-batch-1": ("batch_size",), "last-batch-of-one": ("batch_size",),
    # trained too long: the validation metric worsens while the training loss falls
    "val-worsens": ("epoch",),
    # modes of layers while training
    "trained-in-eval-mode": ("layer_properties",), "module-in-eval-mode": ("layer_properties",),
}


def types_of(code: str) -> tuple[str, ...]:
    """The DeepFD fault types a finding code names (empty: detected, type not named)."""
    return CODES.get(code, ())


def diagnosed(codes: list[str], truth: list[str] | None) -> bool:
    """True when a code names one of the ground-truth fault types."""
    if not truth:
        return False
    return any(t in truth for c in codes for t in types_of(c))
