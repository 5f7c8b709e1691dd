"""Can the model's output reach the targets? A model whose one output per sample is squashed into [0, 1] (a final
sigmoid) or [-1, 1] (tanh, a clamp) after its last weighted layer cannot fit a target of 2: three classes read as one
number with binary cross-entropy (Keras' class_mode='binary'), or a regression target left unscaled behind a
squashing head.

Measured, not read from module names, on a copy in eval mode. The last weighted module to run (one holding a
parameter of ≥ 2 dims) must run once, give one value per sample, be followed by no module holding parameters of its
own (a learnable output scale could widen the bound), and the model's output must be a monotone function of its
output across the batch (a gate or a mixture of experts is not). Then its output is scaled by ±SCALE or more, until
its largest value reaches SCALE, in two more forwards: the model's output stays in the box while it moves. A linear
head is unbounded however small its outputs at initialisation. Evidence, not proof: a warning."""
from __future__ import annotations

import torch

from ...core import batches as B
from ...core.input_scale import weighted

SCALE = 100.0
BOXES = ((0.0, 1.0), (-1.0, 1.0))
EPS = 1e-6


def output_box(model, batch, roles, ctx, samples: int) -> tuple[float, float] | None:
    """(lo, hi) when the model's single output per sample is a squashed function of its last weighted layer's (see
    the module docstring); None otherwise."""
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
    if y is None or not seen or seen[0].numel() != samples or not _monotone(seen[0].reshape(samples), y):
        return None
    most = float(seen[0].abs().amax())
    if not most > 0:
        return None
    big = max(SCALE, SCALE / most)   # the layer's largest output brought to at least SCALE
    reads = [y]
    for s in (big, -big):
        y = _output(work, inputs, ctx, last, s, samples)
        if y is None:
            return None
        reads.append(y)
    ys = torch.stack(reads)
    if not bool((reads[1] - reads[0]).abs().amax() > EPS) or not bool(torch.isfinite(ys).all()):
        return None
    lo, hi = float(ys.amin()), float(ys.amax())
    return next(((a, b) for a, b in BOXES if lo >= a - EPS and hi <= b + EPS), None)


def _last_weighted(work, inputs, ctx):
    """The weighted module that finished last, when it ran once, is not the model itself, and no module finishing
    after it holds parameters of its own; else None."""
    from ...core.tracking import run_forward

    order: list = []
    handles = [m.register_forward_hook(lambda m, a, o: order.append(m)) for m in work.modules()]
    try:
        with torch.no_grad(), ctx.seeded():
            run_forward(work, inputs)
    except Exception:   # the other checks name a forward that fails
        return None
    finally:
        for h in handles:
            h.remove()
    ran = [i for i, m in enumerate(order) if weighted(m)]
    if not ran:
        return None
    i = ran[-1]
    last = order[i]
    if last is work or order.count(last) > 1 or any(any(True for _ in m.parameters(recurse=False)) for m in order[i + 1:]):
        return None
    return last


def _monotone(z, y) -> bool:
    """y moves one way with z across the batch (ties aside): an elementwise squashing, not a gate."""
    ys = y[torch.argsort(z)]
    d = ys[1:] - ys[:-1]
    tol = EPS * max(1.0, float(y.abs().amax()))
    return bool((d >= -tol).all()) or bool((d <= tol).all())


def _output(work, inputs, ctx, last, s: float, samples: int, seen: list | None = None):
    """The model's output (float, one value per sample) with `last`'s output multiplied by s; None otherwise.
    `seen` receives `last`'s own output."""
    from ...core.loss import primary_output
    from ...core.tracking import run_forward

    def scale(m, a, o):
        if not (isinstance(o, torch.Tensor) and o.is_floating_point()):
            return o
        if seen is not None:
            seen.append(o.detach().float())
        return o * s if s != 1.0 else o

    handle = last.register_forward_hook(scale)
    try:
        with torch.no_grad(), ctx.seeded():
            y, _ = primary_output(run_forward(work, inputs))
    except Exception:
        return None
    finally:
        handle.remove()
    if not isinstance(y, torch.Tensor) or not y.is_floating_point() or y.dim() < 1 or y.shape[0] != samples \
            or y[0].numel() != 1:
        return None
    return y.detach().float().reshape(samples)
