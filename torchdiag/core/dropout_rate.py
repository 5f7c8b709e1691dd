"""Dropout layers that keep little of their input in train mode (p ≥ KEEPS_LITTLE): torch's `p` is the share
dropped, TensorFlow 1's `keep_prob` the share kept, so a keep_prob of 0.9 ported as is drops 90% and scales what is
left by 10 (a sweep: Dropout(0.9) by mistake, eval accuracy 0.36 against 0.59 with 0.1, passed watch). Host flags
only, for doctor and watch."""
from __future__ import annotations

CODE = "dropout-rate"
KEEPS_LITTLE = 0.8   # p at or above this: at most a fifth of the values pass, each scaled 5x or more


def dropping_most(model, prefix: str = "") -> list[tuple[str, float]]:
    """(name, p) of the dropout modules of `model` in train mode that drop KEEPS_LITTLE of their input or more."""
    from torch.nn.modules.dropout import _DropoutNd

    return [(prefix + n, float(m.p)) for n, m in model.named_modules()
            if isinstance(m, _DropoutNd) and m.training and m.p >= KEEPS_LITTLE]


def said(found: list[tuple[str, float]]) -> tuple[str, str]:
    """(message, hint) for the modules dropping_most found."""
    top = max(p for _, p in found)
    names = [n or "(root)" for n, _ in found]
    what = (f"Dropout {names[0]} has p={top:g}" if len(found) == 1 else
            f"{len(found)} dropout modules ({', '.join(names[:3])}{' …' if len(names) > 3 else ''}) have p up to {top:g}")
    one = len(found) == 1
    kept = (f"{'zeroes' if one else 'zero'} every value (nothing passes)" if top >= 1 else
            f"{'zeroes' if one else 'zero'} {top * 100:.3g}% of the values and {'scales' if one else 'scale'} the "
            f"rest by {1 / (1 - top):.4g}")   # (a review: p = 0.999 was "100%", p = 1 "scaled by 1e+09")
    return (f"{what}: in train mode {'it' if one else 'they'} {kept} (torch's p is the share dropped; TensorFlow 1's "
            f"keep_prob is the share kept: its {top:g} is torch's {1 - top:.3g})",
            "p = 1 - keep_prob (torch's default is 0.5; 0.1-0.3 is usual); a rate this high on purpose: ignore this")
