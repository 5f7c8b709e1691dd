"""The floor a batch itself puts under a cross-entropy: positions whose outputs are the same (the same input, or the
same context of a language model) with different class targets can at best share one distribution, their targets'
frequencies, whatever the weights. Told by what the model reads and does: positions grouped by their inputs (a sample's
rows, a token's position and the ids up to it) and by their logits at the first step and again at the end (a model
that gave the same answer only once it was trained has collapsed, and one that answers distinct inputs alike from the
start has a fault of its own: neither is a floor of the batch).
A new user's character-level GPT: the first position of two windows starting with the same character and continuing
differently; from a trained checkpoint the run levelled at 0.0169 x its start, against a target of 0.01, and was
cannot-overfit."""
from __future__ import annotations

import math

ROUND = 1e-4        # logits equal to this share of their largest magnitude count as the same answer
MAX_VALUES = 5e7    # the most logit values grouped (rows x classes): beyond it no floor is told


def rows_and_targets(out, loss):
    """(logits as (M, C) float rows, their class targets (M,), the kept positions' mask over all of them, the layout:
    "sample" or "token") for the cross-entropies torchdiag computes, ignored positions left out; None for any other
    loss or output (a class per pixel among them: which inputs make a pixel is not told)."""
    import torch

    from ...core.loss import LEFT_OUT, primary_output

    chosen = getattr(loss, "chosen", "")
    y = primary_output(out)[0]
    if not isinstance(y, torch.Tensor) or not y.is_floating_point() or y.dim() < 2:
        return None
    if chosen == "next_token" and loss.lm is not None and loss.lm.targets is not None:
        rows, t, layout = y[:, :-1].reshape(-1, y.shape[-1]), loss.lm.targets.reshape(-1), "token"
    elif chosen == "token_cross_entropy":
        rows, t, layout = y.reshape(-1, y.shape[-1]), loss.target.reshape(-1), "token"
    elif chosen == "cross_entropy" and loss.target is not None and not loss.target.is_floating_point() and y.dim() == 2:
        rows, t, layout = y, loss.target.reshape(-1), "sample"
    else:
        return None
    if rows.shape[0] != t.shape[0] or rows.numel() > MAX_VALUES:
        return None
    keep = t.to(rows.device) != LEFT_OUT
    return rows.detach().float()[keep], t.to(rows.device)[keep], keep, layout


def same_inputs(batch, loss, layout: str, n: int):
    """A group id per position (all of them, kept or not) by what the model reads for it: a sample's every input
    row (inputs whose dim 0 is the batch), or a token's position and the ids up to it (a language model's ids: the
    ones torchdiag shifted, or the (N, T) integer input). None where that is not told. Two answers alike from
    inputs that differ are the model's doing (a mask that zeroes some samples, an attention that ignores the
    context: a review passed both), not the batch's."""
    import torch

    if layout == "sample":
        rows = [t.detach().reshape(n, -1).double() for _, t in batch.tensors()
                if not t.is_nested and t.dim() and t.shape[0] == n and not t.is_complex()]
        if not rows:
            return None
        return torch.unique(torch.cat(rows, 1), dim=0, return_inverse=True)[1]
    ids = loss.lm.ids if getattr(loss, "chosen", "") == "next_token" else next(
        (t for _, t in batch.tensors() if not t.is_nested and t.dim() == 2 and not t.is_floating_point()
         and not t.is_complex()), None)
    if ids is None:
        return None
    b, length = ids.shape
    if getattr(loss, "chosen", "") == "next_token":
        length -= 1   # the positions that predict a next id
    if b * length != n or b * length * ids.shape[1] > MAX_VALUES:
        return None
    upto = torch.arange(ids.shape[1], device=ids.device)
    prefixes = torch.where(upto[None, :] <= torch.arange(length, device=ids.device)[:, None],   # (length, T)
                           ids[:, None, :].double(), -1.0)                                     # (b, length, T)
    return torch.unique(prefixes.reshape(b * length, -1), dim=0, return_inverse=True)[1]


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


def first_groups(out, loss, batch):
    """The step-0 groups: positions alike in answer and in what the model reads for them (same_inputs); None where
    either is not told."""
    import torch

    found = rows_and_targets(out, loss)
    if found is None or found[0].shape[0] < 2:
        return None
    rows, _, keep, layout = found
    inputs = same_inputs(batch, loss, layout, keep.shape[0])
    if inputs is None:
        return None
    alike = answers(rows)
    return torch.unique(alike * (int(alike.max()) + 1) + inputs.to(alike.device)[keep], return_inverse=True)[1]


def batch_floor(first_ids, out, loss) -> float:
    """The floor (0 when there is none to tell) of the loss at `out`, against the step-0 groups `first_ids`."""
    found = rows_and_targets(out, loss)
    if found is None or first_ids is None:
        return 0.0
    rows, targets = found[0], found[1]
    if rows.shape[0] != first_ids.shape[0] or not rows.shape[0]:
        return 0.0
    value = floor(first_ids, answers(rows), targets)
    return value if math.isfinite(value) else 0.0
