"""Can the model's output reach the targets? A model with one output per sample squashed into [0, 1] (a final
sigmoid) or [-1, 1] (tanh) cannot fit a target of 2: three classes read as one number with binary cross-entropy
(Keras' class_mode='binary'), or a regression target left unscaled behind a sigmoid head. The bound is measured, not
read from module names: the outputs on the first batch and on its float inputs scaled by ±SCALE all stay inside it."""
from __future__ import annotations

import torch

from ...core import batches as B

SCALE = 100.0
BOXES = ((0.0, 1.0), (-1.0, 1.0))
EPS = 1e-6


def output_box(model, batch, roles, ctx) -> tuple[float, float] | None:
    """(lo, hi) when the model's single output per sample stayed within a sigmoid's or tanh's range on every input
    tried (eval, no grad, on a copy); None when it left them, is wider than one value per sample, or the batch has no
    float input to scale."""
    import copy

    from ...core.inputs import ModelInputs
    from ...core.loss import primary_output
    from ...core.tracking import run_forward

    args, kwargs = B.model_call(batch, roles)
    if not any(isinstance(t, torch.Tensor) and t.is_floating_point() for t in (*args, *kwargs.values())):
        return None
    work = copy.deepcopy(model).eval()
    reads = []
    for s in (1.0, SCALE, -SCALE):
        inputs = ModelInputs(tuple(_scaled(a, s) for a in args), {k: _scaled(v, s) for k, v in kwargs.items()},
                             "the data")
        try:
            with torch.no_grad(), ctx.seeded():
                y, _ = primary_output(run_forward(work, inputs.to(ctx.device)))
        except Exception:   # the other checks name a forward that fails
            return None
        if not y.is_floating_point() or (y.dim() > 1 and y.shape[1:].numel() != 1):
            return None
        y = y.detach().float()
        reads.append(torch.stack([torch.isfinite(y).all().float(), y.amin(), y.amax()]))
    finite, lo, hi = torch.stack(reads).cpu().T.tolist()   # one read
    if min(finite) < 1.0:
        return None
    return next(((a, b) for a, b in BOXES if min(lo) >= a - EPS and max(hi) <= b + EPS), None)


def _scaled(t, s: float):
    return t * s if isinstance(t, torch.Tensor) and t.is_floating_point() else t
