"""Broken, or built that way? The facts that tell a real fault from a healthy architecture at
initialisation (issue 14; bench/corpus-findings.md has the models and numbers behind each rule):

- stochastic depth (torchvision StochasticDepth, timm/HF *DropPath) drops a whole residual branch
  for a whole small batch at random: it is switched off (eval) for the judged pass;
- a parameter tiny by construction (layer scale, cls token: per-element RMS < TINY_RMS) is judged by
  its gradient, not by grad/weight;
- a weight whose output goes straight into a batch-statistics normalisation is scale-invariant: its
  gradient is orthogonal to w and scales as 1/|w|, so a step only turns w and grows |w|
  (grad/weight r becomes r / (1 + (lr·r)²) after one SGD step): a large ratio corrects itself and
  is not judged exploding (deep ResNets' stem convolution at init: ratio 1e3–4e3);
- a gradient shrunk by a gate (layer scale, zero-init gain) is judged by behaviour: gated.py.

The checks that run the model again (a step on a copy, a shifted bias) are in recheck.py."""
from __future__ import annotations

import contextlib

TINY_RMS = 1e-4                 # per-element RMS below this: tiny by construction (layer scale 1e-6)


def is_stochastic_depth(mod) -> bool:
    kind = type(mod).__name__
    return kind == "StochasticDepth" or kind.endswith("DropPath") or kind.endswith("StochasticDepth")


def stochastic_depth(model) -> list[str]:
    """Paths of the stochastic-depth modules (torchvision StochasticDepth, timm DropPath, HF *DropPath)."""
    return [n for n, m in model.named_modules() if is_stochastic_depth(m)]


def stochastic_depth_off(model) -> list[str]:
    """Put every stochastic-depth module in eval mode (the caller restores modes: leave_no_trace, or a
    copy); returns their paths."""
    names = []
    for n, m in model.named_modules():
        if is_stochastic_depth(m):
            m.eval()
            names.append(n)
    return names


@contextlib.contextmanager
def stochastic_depth_eval(model):
    """Stochastic depth off for the block, each module's own mode put back after."""
    mods = [m for m in model.modules() if is_stochastic_depth(m)]
    flags = [m.training for m in mods]
    for m in mods:
        m.eval()
    try:
        yield
    finally:
        for m, flag in zip(mods, flags):
            m.training = flag


def is_batch_norm_like(mod) -> bool:
    """A normalisation that makes the loss invariant to the scale of (and any per-channel constant
    added to) the tensor it receives: BatchNorm using batch statistics, GroupNorm, InstanceNorm."""
    from torch import nn
    from torch.nn.modules.batchnorm import _BatchNorm
    from torch.nn.modules.instancenorm import _InstanceNorm

    if isinstance(mod, _BatchNorm):
        return mod.training or mod.running_mean is None
    if isinstance(mod, _InstanceNorm):
        return mod.training or not mod.track_running_stats
    return isinstance(mod, nn.GroupNorm)


def rms(row) -> float | None:
    return row["weight_norm"] / row["numel"] ** 0.5 if row["numel"] else None


def is_tiny(row) -> bool:
    """Tiny by construction: non-zero, per-element RMS below TINY_RMS."""
    r = rms(row)
    return r is not None and 0 < r < TINY_RMS
