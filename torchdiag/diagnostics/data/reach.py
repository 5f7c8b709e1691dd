"""Can the model's output reach the targets? A model whose one output per sample is squashed into [0, 1] (a final
sigmoid) or [-1, 1] (tanh) after its last weighted layer cannot fit a target of 2: three classes read as one number
with binary cross-entropy (Keras' class_mode='binary'), or a regression target left unscaled behind a squashing head.
The bound is measured, not read from module names: the last weighted layer's output (a matmul or a convolution) is
scaled in two more forwards of a copy, by ±SCALE or more (until its largest value is at least SCALE), and the model's
output stays in the box while it moves. A linear head is unbounded however small its outputs at initialisation: its
scaled output reaches SCALE."""
from __future__ import annotations

import torch

from ...core import batches as B

SCALE = 100.0
BOXES = ((0.0, 1.0), (-1.0, 1.0))
EPS = 1e-6


def output_box(model, batch, roles, ctx, samples: int) -> tuple[float, float] | None:
    """(lo, hi) when the model's single output per sample stays within a sigmoid's or tanh's range with its last
    weighted layer's output scaled by 1 and ±SCALE, and the scaling moved it (eval, no grad, on a copy); None
    otherwise, or when the output is not one value per sample of the batch."""
    import copy

    from ...core.inputs import ModelInputs

    args, kwargs = B.model_call(batch, roles)
    inputs = ModelInputs(args, kwargs, "the data").to(ctx.device)
    work = copy.deepcopy(model).eval()
    last = _last_weighted(work, inputs, ctx)
    if last is None:
        return None
    seen: list = []
    y = _output(work, inputs, ctx, last, 1.0, samples, seen)
    if y is None or not seen or not seen[0] > 0:
        return None
    big = max(SCALE, SCALE / seen[0])   # the layer's largest output brought to at least SCALE, however small at init
    reads = [y]
    for s in (big, -big):
        y = _output(work, inputs, ctx, last, s, samples)
        if y is None:
            return None
        reads.append(y)
    moved = bool((reads[1] - reads[0]).abs().amax() > EPS)
    ys = torch.stack(reads)
    if not moved or not bool(torch.isfinite(ys).all()):
        return None
    lo, hi = float(ys.amin()), float(ys.amax())
    return next(((a, b) for a, b in BOXES if lo >= a - EPS and hi <= b + EPS), None)


def _last_weighted(work, inputs, ctx):
    """The weighted module (a parameter of ≥ 2 dims) whose forward finished last, or None."""
    from ...core.tracking import run_forward

    order: list = []
    weighted = [m for m in work.modules() if any(p.dim() >= 2 for p in m.parameters(recurse=False))]
    handles = [m.register_forward_hook(lambda m, a, o: order.append(m)) for m in weighted]
    try:
        with torch.no_grad(), ctx.seeded():
            run_forward(work, inputs)
    except Exception:   # the other checks name a forward that fails
        return None
    finally:
        for h in handles:
            h.remove()
    return order[-1] if order else None


def _output(work, inputs, ctx, last, s: float, samples: int, seen: list | None = None):
    """The model's output (float, one value per sample) with `last`'s output multiplied by s; None otherwise.
    `seen` receives the largest |value| `last` gave (one read, after the forward)."""
    from ...core.loss import primary_output
    from ...core.tracking import run_forward

    held: list = []

    def scale(m, a, o):
        if not (isinstance(o, torch.Tensor) and o.is_floating_point()):
            return o
        held.append(o.detach().abs().amax())
        return o * s if s != 1.0 else o

    handle = last.register_forward_hook(scale)
    try:
        with torch.no_grad(), ctx.seeded():
            y, _ = primary_output(run_forward(work, inputs))
    except Exception:
        return None
    finally:
        handle.remove()
    if seen is not None and held:
        seen.append(float(torch.stack(held).amax()))
    if not isinstance(y, torch.Tensor) or not y.is_floating_point() or y.dim() < 1 or y.shape[0] != samples \
            or y[0].numel() != 1:
        return None
    return y.detach().float().reshape(samples)
