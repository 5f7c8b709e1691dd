"""Is a large grad/weight a small weight whose gradient grows as it shrinks? Behind what divides by its size (a
class token alone in a pre-norm, whose LayerNorm's eps keeps it from being exactly scale-invariant), a weight drawn
small gets a gradient about 1/|w|: grad/weight as 1/|w|^2, though nothing explodes (transformers' PeAudio encoder:
class_embedding at 0.16x the model's typical size, grad/weight ~430, an error). An exploding gradient comes from the
activations or the loss, which the weight's own size does not set: scaled up, its gradient stays (a layer of default
scale beside oversized ones, broken_exploding's head) or grows (an MSE chain). Asked of the grad/weight verdicts left
after the other re-checks whose weight is at most half the model's typical per-element RMS: on a copy, each scaled
alone by s = typical / its RMS, one forward and backward. Passed where its gradient fell at least sqrt(s)-fold (an
exponent of 1/2, half way on a log scale between a normalised weight's 1 and an explosion's 0) and grad/weight at
that size is within --exploding-ratio (a small token inside a truly huge loss stays an error). Measured by a helper
on ~30 cases: every real explosion kept (gains 2.3-3 at lr 1e-4 to 0.1, an input x1e3, a loss x1e4, an LSTM, a
dropout-ridden head); a class token added to a position table of normal size is not passed (its gradient does not
fall: the table sets the scale), nor found in a real model (timm draws its tokens at 1e-6: tiny by construction)."""
from __future__ import annotations

import math
from dataclasses import dataclass

SMALL = 2.0          # the weight at most 1/SMALL of the model's typical per-element RMS to be asked
EXPONENT = 0.5       # the gradient must fall at least as s**EXPONENT when the weight is scaled by s
MAX_GROWN = 16       # parameters asked at most


@dataclass
class Grown:
    scale: float      # s: the weight scaled to the model's typical per-element RMS
    fell: float       # its gradient's norm before / after
    ratio: float      # grad/weight at that size


def at_typical_size(model, inputs, asked: dict[str, float], ctx, prepare, eval_mode: bool) -> dict[str, Grown]:
    """`asked`: name -> s. Each scaled alone by s on one copy (its value put back after), one forward and backward
    each plus one as it is; every number read back once."""
    import torch

    from ...core import train
    from ...core.device import widened
    from ...core.gates import fresh_copy
    from ...core.readback import read_back
    from ...core.tracking import run_forward

    work = fresh_copy(model, ctx, eval_mode, prepare)
    params = dict(work.named_parameters())
    names = [n for n in asked if n in params][:MAX_GROWN]

    def grads(of: list[str]) -> list:
        """The loss, then the gradient norm of each of `of`, of one forward and backward."""
        work.zero_grad(set_to_none=True)
        with torch.enable_grad(), ctx.seeded(), ctx.autocast():
            loss = ctx.loss()(run_forward(work, inputs, phase="forward (a small weight at the typical size, on a copy)"))
        train.backward(loss)
        zero = widened(loss.detach()).reshape(()) * 0
        return [widened(loss.detach()).reshape(())] + [
            widened(params[n].grad.detach()).norm() if params[n].grad is not None else zero for n in of]

    base, scaled = grads(names), []
    for n in names:
        kept = params[n].detach().clone()
        with torch.no_grad():
            params[n].mul_(asked[n])
        scaled.append(grads([n])[1])
        with torch.no_grad():
            params[n].copy_(kept)
        scaled.append(widened(kept).norm() * asked[n])
    values = read_back(base + scaled)
    out = {}
    for k, n in enumerate(names):
        g0, g1, w1 = values[1 + k], values[1 + len(names) + 2 * k], values[2 + len(names) + 2 * k]
        if all(math.isfinite(v) for v in (values[0], g0, g1, w1)) and g0 > 0 and g1 > 0 and w1 > 0:
            out[n] = Grown(asked[n], g0 / g1, g1 / w1)
    return out


def passes(g: Grown, limit: float) -> bool:
    return g.fell >= g.scale ** EXPONENT and g.ratio <= limit
