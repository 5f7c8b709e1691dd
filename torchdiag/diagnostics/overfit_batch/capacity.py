"""A batch beyond what the model can hold (issue 32). overfit-batch asks whether the model, loss and optimizer
train at all. A model with fewer trainable values than the batch has target values cannot interpolate them in
general (its outputs over the batch lie on a manifold of at most that many dimensions: a 4-weight logistic model
on 64 labels, a 35-weight iris MLP on 64 × 3 one-hot targets), so not memorising the batch says nothing of a
fault. When such a run fails with no mechanical cause found, a fresh copy is trained on two of its samples whose
targets differ (a constant cannot fit them, so memorising them needs the input): memorised, the training works
and what fails is the batch's size for this model: info `capacity-limited`, with both runs' numbers. Not
memorised either, or a model with as many trainable values as target values (a review: a forgotten ReLU, a
softmax over the batch, conflicting duplicate rows all memorise two samples and fail the batch): the error
stands. Without a per-sample target tensor (the model's own loss, next-token ids) nothing is claimed. Cost: one
more run on two samples, only for such small models."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...core.device import wide_float, widened

FEW = 2
CODE = "capacity-limited"


@dataclass
class Few:
    samples: list[int]      # the batch indices trained on
    curve: Any              # its loop.Curve


def limited(trainable: int, batch: int | None, target) -> bool:
    """Fewer trainable values than the batch's target values (a per-sample target tensor only)."""
    import torch

    ok = isinstance(target, torch.Tensor) and target.dim() > 0 and batch is not None and target.shape[0] == batch
    return ok and trainable < target.numel()


def pick(batch: int | None, target, inputs=None) -> list[int] | None:
    """The first sample with a usable target and, of the others whose target differs from it, the one whose input
    lies farthest from it (two near-identical inputs with different targets need a steep model: not what is
    asked). Rows whose target is all ignored (-100) or not finite are never picked. None for a batch of two or fewer, without a
    per-sample target, or when no row differs from the first."""
    import torch

    if not batch or batch <= FEW or not isinstance(target, torch.Tensor) or not target.dim() \
            or target.shape[0] != batch:
        return None
    flat = target.reshape(batch, -1)
    usable = flat.isfinite().all(dim=1) if flat.is_floating_point() else (flat != -100).any(dim=1)
    first = usable.int().argmax()          # the first usable row (row 0 unless its target is all ignored)
    differs = (flat != flat[first]).any(dim=1) & usable & usable[first]
    x = _first_float(inputs, batch)
    wide = wide_float(differs.device)   # float32 on mps (no float64 there)
    far = widened(x - x[first.to(x.device)]).norm(dim=1).to(differs.device, wide) if x is not None \
        else differs.to(wide) * 0
    # one read: the anchor, and the rows whose target differs scored by their distance from it (-1 for the others)
    score = torch.cat([first.to(wide).reshape(1), torch.where(differs, far, -1.0)]).tolist()
    anchor, score = int(score[0]), score[1:]
    best = max(range(batch), key=lambda i: (score[i], -i))
    return [anchor, best] if score[best] >= 0 else None


def _first_float(inputs, batch: int):
    """The first floating input with a row per sample, one row each (None: none, e.g. token ids only)."""
    import torch

    for _, t in inputs.tensors() if inputs is not None else ():
        if t.is_floating_point() and t.layout == torch.strided and not t.is_nested and t.dim() and t.shape[0] == batch:
            return t.detach().reshape(batch, -1)
    return None


def train_few(model, trainer, trainable: int, opts, ctx, train) -> Few | None:
    """A fresh copy trained on `pick`'s samples of the run's batch, with the run's loss rule and target rows
    (`train(model, inputs, loss, opts)` trains it as the run's copy was trained: its Curve). None when the model
    is not `limited` (`trainable` values) or no pair is there to pick."""
    import torch

    batch, target = trainer.batch.batch_size, trainer.loss_fn.target
    idx = pick(batch, target, trainer.batch) if limited(trainable, batch, target) else None
    if idx is None:
        return None
    index = torch.tensor(idx)

    def rows(t):
        return t.index_select(0, index.to(t.device)) if t.dim() and t.shape[0] == batch else t

    loss = ctx.loss()
    loss.target, loss.made_target = rows(target), trainer.loss_fn.made_target
    return Few(idx, train(model, trainer.batch.map(rows), loss, opts))


def memorised(few: Few | None) -> bool:
    return few is not None and few.curve.reached_at is not None and not few.curve.interrupted
