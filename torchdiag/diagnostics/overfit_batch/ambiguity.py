"""The floor a batch itself puts under a cross-entropy: positions whose outputs are the same (the same input, or the
same context of a language model) with different class targets can at best share one distribution, their targets'
frequencies, whatever the weights. Told by behaviour: positions grouped by their logits at the first step and again at
the end (a model that gave the same answer only once it was trained has collapsed, which is no floor of the batch).
A new user's character-level GPT: the first position of two windows starting with the same character and continuing
differently; from a trained checkpoint the run levelled at 0.0169 x its start, against a target of 0.01, and was
cannot-overfit."""
from __future__ import annotations

import math

ROUND = 1e-4        # logits equal to this share of their largest magnitude count as the same answer
MAX_VALUES = 5e7    # the most logit values grouped (rows x classes): beyond it no floor is told


def rows_and_targets(out, loss):
    """(logits as (M, C) float rows, their class targets (M,)) for the cross-entropies torchdiag computes, ignored
    positions left out; None for any other loss or output."""
    import torch

    from ...core.loss import LEFT_OUT, primary_output

    chosen = getattr(loss, "chosen", "")
    y = primary_output(out)[0]
    if not isinstance(y, torch.Tensor) or not y.is_floating_point() or y.dim() < 2:
        return None
    if chosen == "next_token" and loss.lm is not None and loss.lm.targets is not None:
        rows, t = y[:, :-1].reshape(-1, y.shape[-1]), loss.lm.targets.reshape(-1)
    elif chosen == "token_cross_entropy":
        rows, t = y.reshape(-1, y.shape[-1]), loss.target.reshape(-1)
    elif chosen == "cross_entropy" and loss.target is not None and not loss.target.is_floating_point():
        rows, t = y.movedim(1, -1).reshape(-1, y.shape[1]), loss.target.reshape(-1)
    else:
        return None
    if rows.shape[0] != t.shape[0] or rows.numel() > MAX_VALUES:
        return None
    keep = t.to(rows.device) != LEFT_OUT
    return rows.detach().float()[keep], t.to(rows.device)[keep]


def answers(rows):
    """A group id per row: rows equal to ROUND of their largest magnitude share one (on the device)."""
    import torch

    scale = float(rows.abs().amax()) or 1.0
    _, ids = torch.unique(torch.round(rows / (ROUND * scale)), dim=0, return_inverse=True)
    return ids


def floor(first_ids, last_ids, targets) -> float:
    """The mean cross-entropy no weights can go below: in each group of positions that had the same answer at the
    first step and at the last, the entropy of their targets (one read)."""
    import torch

    group = torch.unique(first_ids * (int(last_ids.max()) + 1) + last_ids, return_inverse=True)[1]
    classes = int(targets.max()) + 1
    pairs, counts = torch.unique(group * classes + targets, return_counts=True)
    sizes = torch.bincount(group)[pairs // classes]
    counts = counts.double()
    total = float(-(counts * torch.log(counts / sizes.double())).sum())
    return total / max(1, targets.numel())


def batch_floor(first_ids, out, loss) -> float:
    """The floor (0 when there is none to tell) of the loss at `out`, against the step-0 groups `first_ids`."""
    found = rows_and_targets(out, loss)
    if found is None or first_ids is None:
        return 0.0
    rows, targets = found
    if rows.shape[0] != first_ids.shape[0] or not rows.shape[0]:
        return 0.0
    value = floor(first_ids, answers(rows), targets)
    return value if math.isfinite(value) else 0.0
