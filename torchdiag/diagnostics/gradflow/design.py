"""Broken, or built that way? The facts that tell a real fault from a healthy architecture at
initialisation (bench/corpus-findings.md has the models and numbers behind each rule):

- stochastic depth is switched off (eval) for the judged pass (core/design.py);
- a parameter tiny by construction (layer scale, cls token: per-element RMS < TINY_RMS) is judged by
  its gradient, not by grad/weight;
- a weight whose output goes straight into a batch-statistics normalisation is scale-invariant: its
  gradient is orthogonal to w and scales as 1/|w|, so a step only turns w and grows |w|
  (grad/weight r becomes r / (1 + (lr·r)²) after one SGD step): a large ratio corrects itself and
  is not judged exploding (deep ResNets' stem convolution at init: ratio 1e3–4e3);
- a gradient shrunk by a gate (layer scale, zero-init gain) is judged by behaviour: gated.py.

The checks that run the model again (a step on a copy, a shifted bias) are in recheck.py."""
from __future__ import annotations

from ...core.design import TINY_RMS  # noqa: E402  (per-element RMS below it: tiny by construction)


def rms(row) -> float | None:
    return row["weight_norm"] / row["numel"] ** 0.5 if row["numel"] else None


def is_tiny(row) -> bool:
    """Tiny by construction: non-zero, per-element RMS below TINY_RMS."""
    r = rms(row)
    return r is not None and 0 < r < TINY_RMS
