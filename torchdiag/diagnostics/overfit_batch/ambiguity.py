"""The floor a batch itself puts under a cross-entropy: positions whose outputs are the same (the same input, or the
same context of a language model) with different class targets can at best share one distribution, their targets'
frequencies, whatever the weights. Told by what the model reads and does: positions grouped by their inputs (a sample's
rows, a token's position and the ids up to it) and by their logits at the first step and again at the end (a model
that gave the same answer only once it was trained has collapsed, and one that answers distinct inputs alike from the
start has a fault of its own: neither is a floor of the batch).
A new user's character-level GPT: the first position of two windows starting with the same character and continuing
differently; from a trained checkpoint the run levelled at 0.0169 x its start, against a target of 0.01, and was
cannot-overfit.
Host reads: none until a floor is asked (at an extension of the budget, or by the verdict of a run short of its
target), then one."""
from __future__ import annotations

ROUND = 1e-4        # logits equal to this share of their largest magnitude count as the same answer
MAX_VALUES = 2e7    # the most values grouped (rows x classes, or a token's ids up to it): beyond it no floor is told


def rows_and_targets(out, loss):
    """(logits as (M, C) rows, their class targets (M,), the layout: "sample" or "token") for the cross-entropies
    torchdiag computes; None for any other loss or output (a class per pixel among them: which inputs make a pixel
    is not told). No read: ignored targets stay in, as LEFT_OUT."""
    import torch

    from ...core.loss import primary_output

    chosen = getattr(loss, "chosen", "")
    y = primary_output(out)[0]
    if not isinstance(y, torch.Tensor) or not y.is_floating_point() or y.dim() < 2 or y.numel() > MAX_VALUES:
        return None
    if chosen == "next_token" and loss.lm is not None and loss.lm.targets is not None:
        rows, t, layout = y[:, :-1].reshape(-1, y.shape[-1]), loss.lm.targets.reshape(-1), "token"
    elif chosen == "token_cross_entropy":
        rows, t, layout = y.reshape(-1, y.shape[-1]), loss.target.reshape(-1), "token"
    elif chosen == "cross_entropy" and loss.target is not None and not loss.target.is_floating_point() and y.dim() == 2:
        rows, t, layout = y, loss.target.reshape(-1), "sample"
    else:
        return None
    if rows.shape[0] != t.shape[0] or rows.shape[0] < 2:
        return None
    return rows.detach(), t.to(rows.device), layout


def answers(rows):
    """The rows rounded to ROUND of their largest magnitude, as float32 (whole numbers up to 1 / ROUND: exact): rows
    alike in answer are alike here (no read)."""
    import torch

    rows = rows.float()
    return torch.round(rows / (ROUND * rows.abs().amax().clamp_min(1e-30)))


def same_inputs(batch, loss, layout: str, n: int):
    """What the model reads for each of the n positions, one row each (no read): a sample's every input row (inputs
    whose dim 0 is the batch), or a token's ids up to it, -1 past it (a language model's ids: the ones torchdiag
    shifted, or the (N, T) integer input). None where that is not told. Two answers alike from inputs that differ
    are the model's doing (a mask that zeroes some samples, an attention that ignores the context: a review passed
    both), not the batch's."""
    import torch

    if layout == "sample":
        rows = [t.detach().reshape(n, -1).float() for _, t in batch.tensors()
                if not t.is_nested and t.dim() and t.shape[0] == n and not t.is_complex()]
        return torch.cat(rows, 1) if rows and sum(r.shape[1] for r in rows) * n <= MAX_VALUES else None
    next_ids = getattr(loss, "chosen", "") == "next_token"
    ids = loss.lm.ids if next_ids else next(
        (t for _, t in batch.tensors() if not t.is_nested and t.dim() == 2 and not t.is_floating_point()
         and not t.is_complex()), None)
    if ids is None:
        return None
    b, length = ids.shape[0], ids.shape[1] - (1 if next_ids else 0)   # next ids: the positions that predict one
    if b * length != n or n * ids.shape[1] > MAX_VALUES:
        return None
    upto = torch.arange(ids.shape[1], device=ids.device)
    prefixes = torch.where(upto[None, :] <= torch.arange(length, device=ids.device)[:, None],   # (length, T)
                           ids[:, None, :].float(), -1.0)                                      # (b, length, T)
    return prefixes.reshape(n, -1)


class FirstGroups:
    """What the step-0 output and the inputs say of each position (answers and same_inputs, side by side), kept on
    the device until a floor is asked: no read on a run that passes."""

    def __init__(self, key):
        self.key = key


def first_groups(out, loss, batch) -> FirstGroups | None:
    """FirstGroups of a cross-entropy over class rows, or None for any other loss or output, or inputs not told."""
    import torch

    found = rows_and_targets(out, loss)
    if found is None:
        return None
    rows, _, layout = found
    inputs = same_inputs(batch, loss, layout, rows.shape[0])
    return None if inputs is None else FirstGroups(torch.cat([answers(rows), inputs.to(rows.device)], 1))


def floor(key, targets, classes: int) -> float:
    """The mean cross-entropy no weights can go below: in each group of positions with equal rows of `key`, the
    entropy of their targets (LEFT_OUT ones aside). One read: rows are told apart by a seeded random projection
    (equal rows, equal values; different ones differ but by a coincidence of measure 0) and counted by sorting, with
    no size that depends on the values (torch.unique reads one back per call)."""
    import random

    import torch

    from ...core.loss import LEFT_OUT

    n, device = targets.shape[0], targets.device
    keep = targets != LEFT_OUT
    g = torch.Generator().manual_seed(0)
    w = torch.randn(key.shape[1], generator=g, dtype=torch.float64).to(device)
    alone = -(torch.arange(n, device=device, dtype=torch.float64) + 1) * 1e20   # an ignored position: its own group
    group = torch.where(keep, key.double() @ w, alone)
    pair = group + torch.where(keep, targets, 0).double() * random.Random(0).gauss(0.0, 1.0)
    share = _counts(pair).double() / _counts(group).double()
    total, kept = torch.stack([-(torch.log(share) * keep).sum(), keep.sum().double()]).tolist()
    return total / kept if kept else 0.0


def _counts(values):
    """For each element, how many elements equal it (sorted, then each run's length from its ends: no read)."""
    import torch

    order = torch.argsort(values)
    v = values[order]
    n = v.shape[0]
    at = torch.arange(n, device=v.device)
    first = torch.ones(n, dtype=torch.bool, device=v.device)
    first[1:] = v[1:] != v[:-1]
    last = torch.ones(n, dtype=torch.bool, device=v.device)
    last[:-1] = v[:-1] != v[1:]
    start = torch.cummax(torch.where(first, at, 0), 0).values
    end = torch.cummin(torch.where(last, at, n).flip(0), 0).values.flip(0)
    counts = torch.empty_like(at)
    counts[order] = end - start + 1
    return counts


def batch_floor(first, out, loss) -> float:
    """The floor (0 when there is none to tell) of the loss at `out`, against the step-0 FirstGroups `first`."""
    import math

    import torch

    found = rows_and_targets(out, loss) if first is not None else None
    if found is None or found[0].shape[0] != first.key.shape[0]:
        return 0.0
    rows, targets, _ = found
    value = floor(torch.cat([first.key, answers(rows)], 1), targets, rows.shape[1])
    return value if math.isfinite(value) else 0.0
