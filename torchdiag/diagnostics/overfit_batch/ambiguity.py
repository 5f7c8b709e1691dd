"""The floor a batch itself puts under a cross-entropy: positions whose outputs are the same (the same input, or the
same context of a language model) with different class targets can at best share one distribution, their targets'
frequencies, whatever the weights. Told by what the model reads and does: positions grouped by their inputs (a sample's
every input row; a token's position and every per-token input of its sequence, or of its prefix where the model is
causal) and by their logits at the first step and again at the end (a model that gave the same answer only once it
was trained has collapsed, and one that answers distinct inputs alike from the start has a fault of its own: neither
is a floor of the batch). Where an input is not laid out by sample (or by sample and token), nothing is told.
A new user's character-level GPT: the first position of two windows starting with the same character and continuing
differently; from a trained checkpoint the run levelled at 0.0169 x its start, against a target of 0.01, and was
cannot-overfit.
Rows are compared through seeded random projections in float64, float32 on mps (equal rows, equal values; different
ones differ but by a coincidence of measure 0; integers exact below 2^53, 2^24 on mps), so the run keeps one value per
position, not a copy of the logits. Host reads: none until a floor is asked (at an extension of the budget, or by the
verdict of a run short of its target), then one, and one forward of the trained copy to tell whether it is causal."""
from __future__ import annotations

ROUND = 1e-4        # logits equal to this share of their largest magnitude count as the same answer
MAX_VALUES = 5e7    # the most logit values (rows x classes) grouped: beyond it no floor is told


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
    if chosen in ("next_token", "own_token") and loss.lm is not None and loss.lm.targets is not None:
        rows = y[:, :y.shape[1] - loss.lm.shift].reshape(-1, y.shape[-1])
        t, layout = loss.lm.targets.reshape(-1), "token"
    elif chosen == "token_cross_entropy":
        rows, t, layout = y.reshape(-1, y.shape[-1]), loss.target.reshape(-1), "token"
    elif chosen == "cross_entropy" and loss.target is not None and not loss.target.is_floating_point() and y.dim() == 2:
        rows, t, layout = y, loss.target.reshape(-1), "sample"
    else:
        return None
    if rows.shape[0] != t.shape[0] or rows.shape[0] < 2:
        return None
    return rows.detach(), t.to(rows.device), layout


def _project(matrix, seed: int):
    """One value per row of `matrix` (2-D), in the device's widest float: its dot product with a seeded random vector
    (no read)."""
    import torch

    from ...core.device import wide_float

    wide = wide_float(matrix.device)
    w = torch.randn(matrix.shape[1], generator=torch.Generator().manual_seed(seed))
    return matrix.to(wide) @ w.to(matrix.device, wide)


def answers(rows):
    """The rows rounded to ROUND of their largest magnitude, projected: rows alike in answer alike here (no read)."""
    import torch

    from ...core.device import widened

    rows = widened(rows)
    return _project(torch.round(rows / (ROUND * rows.abs().amax().clamp_min(1e-30))), 1)


def same_inputs(batch, layout: str, n: int, length: int):
    """What the model reads for each position, projected (no read): {"whole": one value per position} for a sample's
    every input row, or a token's position and its sequence's every per-token input; and for tokens "prefix" too:
    the per-token inputs up to the position (used where the model is causal). None where an input tensor is laid out
    otherwise (not batch-first: a review's time-first GRU input was left out of the key, and a model that read only
    the other input passed). Two answers alike from inputs that differ are the model's doing (a mask that zeroes some
    samples, an attention that ignores the context), not the batch's."""
    import torch

    from ...core.device import widened

    tensors = [t for _, t in batch.tensors() if not t.is_complex()]
    b = n // length if layout == "token" else n
    if not tensors or any(t.is_nested or t.dim() == 0 or t.shape[0] != b for t in tensors):
        return None
    if layout == "sample":
        return {"whole": _project(torch.cat([widened(t.detach().reshape(b, -1)) for t in tensors], 1), 2)}
    steps = [t for t in tensors if t.dim() >= 2 and t.shape[1] >= length]
    if len(steps) != len(tensors):   # every input per token (ids, a mask, token types), the first `length` read
        return None
    per = torch.cat([widened(t.detach()[:, :length].reshape(b, length, -1)) for t in steps], 2)   # (b, length, F)
    token = _project(per.reshape(b * length, -1), 3).reshape(b, length)
    weight = torch.randn(length, generator=torch.Generator().manual_seed(4)).to(token.device, token.dtype)
    where = torch.arange(length, device=token.device, dtype=token.dtype)[None, :].expand(b, length)
    prefix = torch.cumsum(token * weight, 1) + 1e3 * where     # (a token's position in the key: its prefix length)
    whole = (token * weight).sum(1, keepdim=True) + 1e3 * where
    return {"whole": whole.reshape(-1), "prefix": prefix.reshape(-1)}


class FirstGroups:
    """What the step-0 output and the inputs say of each position, one value each, kept on the device until a floor
    is asked: no read on a run that passes."""

    def __init__(self, first, inputs: dict, layout: str):
        self.first, self.inputs, self.layout = first, inputs, layout
        self.by_prefix = False   # the last floor grouped tokens by their prefix (the model was causal): said

    def key(self, causal: bool):
        self.by_prefix = causal and "prefix" in self.inputs
        return self.first + 7.0 * self.inputs["prefix" if self.by_prefix else "whole"]


def first_groups(out, loss, batch) -> FirstGroups | None:
    """FirstGroups of a cross-entropy over class rows, or None for any other loss or output, or inputs not told."""
    found = rows_and_targets(out, loss)
    if found is None:
        return None
    from ...core.loss import primary_output

    rows, _, layout = found
    length = rows.shape[0] // int(primary_output(out)[0].shape[0]) if layout == "token" else 1
    inputs = same_inputs(batch, layout, rows.shape[0], length)
    return None if inputs is None else FirstGroups(answers(rows), inputs, layout)


def causal(work, batch, out, autocast) -> bool:
    """Each position of the trained copy's (N, T, ...) output reads only its prefix: every per-token input changed at
    its last position leaves the outputs before it as they were (one forward, one read)."""
    import torch

    from ...core.device import widened
    from ...core.loss import primary_output

    y = primary_output(out)[0]
    if not isinstance(y, torch.Tensor) or y.dim() < 3 or y.shape[1] < 2:
        return False
    n, length = y.shape[0], y.shape[1]

    def changed(t):
        if t.is_complex() or t.is_nested or t.dim() < 2 or t.shape[0] != n or t.shape[1] != length:
            return t
        t = t.clone()
        t[:, -1] = t[:, -1] + 1 if t.is_floating_point() else (t[:, -1] + 1) % (t.max() + 1)
        return t

    with torch.no_grad(), autocast():
        z = primary_output(batch.map(changed).call(work))[0]
    if not isinstance(z, torch.Tensor) or z.shape != y.shape:
        return False
    before, after = widened(y[:, :-1]), widened(z[:, :-1])
    return bool(((after - before).abs() <= 1e-6 * before.abs().amax().clamp_min(1e-30)).all())


def floor(group, targets) -> float:
    """The mean cross-entropy no weights can go below: in each group of positions with equal values of `group`, the
    entropy of their targets (LEFT_OUT ones aside). One read; counted by sorting, with no size that depends on the
    values (torch.unique reads one back per call)."""
    import random

    import torch

    from ...core.device import wide_float
    from ...core.loss import LEFT_OUT

    n, device = targets.shape[0], targets.device
    wide = wide_float(device)   # (float32 on mps: equal values stay equal, a coincidence less unlikely)
    keep = targets != LEFT_OUT
    alone = -(torch.arange(n, device=device, dtype=wide) + 1) * 1e30   # an ignored position: its own group
    group = torch.where(keep, group.to(wide), alone)
    pair = group + torch.where(keep, targets, 0).to(wide) * random.Random(0).gauss(0.0, 1.0)
    share = _counts(pair).to(wide) / _counts(group).to(wide)
    total, kept = torch.stack([-(torch.log(share) * keep).sum(), keep.sum().to(wide)]).tolist()
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


def batch_floor(first, out, loss, causal=lambda: False) -> float:
    """The floor (0 when there is none to tell) of the loss at `out`, against the step-0 FirstGroups `first`.
    `causal()`: whether each position reads only its prefix (asked for tokens only: one forward)."""
    import math

    found = rows_and_targets(out, loss) if first is not None else None
    if found is None or found[0].shape[0] != first.first.shape[0]:
        return 0.0
    rows, targets, _ = found
    value = floor(first.key(first.layout == "token" and causal()) + 11.0 * answers(rows), targets)
    return value if math.isfinite(value) else 0.0
