"""A batch beyond what the model can hold (issue 32). overfit-batch asks whether the model, loss and optimizer
train at all; its canonical form overfits "a batch of as few as two examples". When the whole batch is not
memorised and no mechanical cause was found, a fresh copy is trained on two of its samples whose targets
differ (a constant cannot fit them, so memorising them needs the input): memorised, the training works and
what fails is the batch's size for this model (a 4-weight logistic model on 64 samples of overlapping
classes, a 35-weight iris MLP): info `capacity-limited`, with both runs' numbers. Not memorised either: the
error stands, said of two samples too. Cost: one more run of the same budget on two samples."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

FEW = 2
CODE = "capacity-limited"


@dataclass
class Few:
    samples: list[int]      # the batch indices trained on
    curve: Any              # its loop.Curve


def pick(batch: int | None, target, inputs=None) -> list[int] | None:
    """The first sample and, of the later ones whose target differs from it, the one whose input lies farthest
    from it (two near-identical inputs with different targets need a steep model: not what is asked); [0, 1]
    when the loss has no per-sample target (an LM's next tokens, the model's own loss); None for a batch of two
    or fewer, or when every target is the same (a constant fits them: memorising says nothing)."""
    import torch

    if not batch or batch <= FEW:
        return None
    if not isinstance(target, torch.Tensor) or not target.dim() or target.shape[0] != batch:
        return [0, 1]
    flat = target.reshape(batch, -1)
    differs = (flat != flat[0]).any(dim=1)
    x = _first_float(inputs, batch)
    far = (x - x[0]).double().norm(dim=1).to(differs.device) if x is not None else differs.double() * 0
    # one read: the rows whose target differs, scored by their distance from row 0 (-1 for the others)
    score = torch.where(differs, far, -1.0).tolist()
    best = max(range(batch), key=lambda i: (score[i], -i))
    return [0, best] if score[best] >= 0 else None


def _first_float(inputs, batch: int):
    """The first floating input with a row per sample, one row each (None: none, e.g. token ids only)."""
    import torch

    for _, t in inputs.tensors() if inputs is not None else ():
        if t.is_floating_point() and t.layout == torch.strided and not t.is_nested and t.dim() and t.shape[0] == batch:
            return t.detach().reshape(batch, -1)
    return None


def train_few(model, trainer, opts, ctx, make_trainer) -> Few | None:
    """A fresh copy trained on `pick`'s samples of the run's batch, with the run's loss rule and target rows
    (`make_trainer(model, inputs, loss, opts)` builds the Trainer as the run's was built). None when no pair is
    there to pick."""
    import torch

    batch, target = trainer.batch.batch_size, trainer.loss_fn.target
    idx = pick(batch, target, trainer.batch)
    if idx is None:
        return None
    index = torch.tensor(idx)

    def rows(t):
        return t.index_select(0, index.to(t.device)) if t.dim() and t.shape[0] == batch else t

    loss = ctx.loss()
    if isinstance(target, torch.Tensor) and target.dim() and target.shape[0] == batch:
        loss.target, loss.made_target = rows(target), trainer.loss_fn.made_target
    return Few(idx, make_trainer(model, trainer.batch.map(rows), loss, opts).train())


def memorised(few: Few | None) -> bool:
    return few is not None and few.curve.reached_at is not None and not few.curve.interrupted
