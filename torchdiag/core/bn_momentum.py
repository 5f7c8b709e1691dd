"""What a model's BatchNorms keep as running statistics, for doctor and watch: mostly the last batch (a momentum of 0.5
or more: torch's momentum is the newest batch's weight, TensorFlow's the old statistics', so TensorFlow's 0.99 copied
as is keeps 99% of the last batch: torchvision's MaxViT before 0.18, transformers' EfficientNet, ALIGN and MobileNet
V1/V2), or nothing (momentum 0, the statistics still at mean 0, variance 1 after training steps). Host flags and one
read of the momentum-0 ones' statistics."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

CODE = "batchnorm-momentum"
KEEPS_LAST = 0.5


@dataclass
class Kept:
    """One finding's facts: which modules, and what their statistics keep."""

    names: list[str]
    message: str
    hint: str
    verdict: str
    members: list[str] | None = field(default=None)


def odd(model) -> list[tuple[str, Any]]:
    """(name, module) of the BatchNorms whose momentum is one this module judges (host flags only)."""
    from torch.nn.modules.batchnorm import _BatchNorm

    from .lazy import is_uninitialised

    return [(n, m) for n, m in model.named_modules() if isinstance(m, _BatchNorm) and m.track_running_stats
            and m.running_mean is not None and not is_uninitialised(m.running_mean) and m.momentum is not None
            and (m.momentum >= KEEPS_LAST or m.momentum == 0)]


def kept_statistics(model, prefix: str = "", only: set[str] | None = None) -> list[Kept]:
    """The BatchNorms of `model` whose running statistics keep mostly the last batch, then those that never moved
    (asked after training steps: a fresh model's are at their start by construction). `prefix` names them; `only`:
    the names (unprefixed) to judge, those that ran in train mode (watch: a BatchNorm frozen in eval keeps the
    statistics it was given, whatever its momentum)."""
    import torch

    bns: list[tuple[str, Any, float]] = [(prefix + n, m, float(m.momentum)) for n, m in odd(model)
                                         if only is None or n in only]
    out = []
    high = [(n, w) for n, _, w in bns if w >= KEEPS_LAST]
    if high:
        names, v = [n for n, _ in high], max(w for _, w in high)
        out.append(_kept(names, f"{_subject(names)} momentum {'up to ' if len(high) > 1 else ''}{v:g}: torch's "
                         "momentum is the weight of the newest batch, so the running statistics weigh the last "
                         f"training batch {v:.4g} and all before it {1 - v:.4g}, and eval mode normalises with "
                         "whichever batch came last (TensorFlow's momentum is the old statistics' weight: its "
                         f"{v:g} is torch's {1 - v:.4g})",
                         "momentum = 1 - the TensorFlow/Keras value (0.01 for Keras's 0.99); torch's default is 0.1",
                         f"running statistics are {v:.4g} the last batch's"))
    still = [(n, m) for n, m, w in bns if w == 0 and m.running_mean.device.type != "meta"]
    if not still:
        return out
    try:   # one read: is each one's statistics still where BatchNorm starts them?
        start = torch.stack([(m.running_mean == 0).all() & (m.running_var == 1).all() for _, m in still]).tolist()
    except Exception:   # noqa: BLE001 - statistics that cannot be read as one (sharded, on several devices): not judged
        return out
    names = [n for (n, _), s in zip(still, start) if s]
    if names:
        out.append(_kept(names, f"{_subject(names)} momentum 0 and running statistics still at mean 0, variance 1 "
                         "after the training steps: eval mode normalises with those, not with the data's",
                         "momentum 0 never updates the statistics: use torch's default 0.1; to keep a trained "
                         "model's statistics, put its BatchNorms in eval mode instead",
                         "running statistics never move from mean 0, variance 1"))
    return out


def _kept(names: list[str], message: str, hint: str, verdict: str) -> Kept:
    return Kept(names, message, hint, verdict, names if len(names) > 1 else None)


def _subject(names: list[str]) -> str:
    if len(names) == 1:
        return f"BatchNorm {names[0] or '(root)'} has"
    more = f" (+{len(names) - 3} more)" if len(names) > 3 else ""
    return f"{len(names)} BatchNorm modules ({', '.join(names[:3])}{more}) have"
