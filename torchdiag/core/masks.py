"""What an additive attention mask looks like: the -inf that nancheck, doctor and watch's replay read as a mask,
not bad data."""
from __future__ import annotations


def additive_mask(t) -> bool:
    """An additive attention mask: non-finite values, every one -inf, beside finite ones that are ≤ 0 (0, a -1e4 fill,
    ALiBi's negative biases; a review: a real -inf in mixed-sign data clamped by a ReLU passed as a mask, an exp's
    +Inf inside a model was read as one)."""
    import torch

    d = t.detach()
    if not d.is_floating_point():
        return False
    fin = torch.isfinite(d)
    return not bool(fin.all()) and bool((d[~fin] == float("-inf")).all()) and bool((d[fin] <= 0).all())
