"""Does the loss depend on a parameter at all? (gradflow's `invariant`, doctor's update check.)

A bias followed by a batch-statistics normalisation (BatchNorm in train mode, InstanceNorm), or added to
logits before a softmax over the dimension it is constant in, is cancelled exactly: its gradient is zero or
rounding noise, and no optimizer step moves it, by design. Tested by behaviour on a float64 copy: the
parameters are shifted by a random vector (one value per element, so a softmax's invariance to one constant
added to every logit does not count) and the same seeded forward is run; when the loss does not move
(relative change < 1e-9, far above float64 rounding, far below any real dependence), it does not depend on
them. All names are shifted together first; a group that moves the loss is halved, so one real dependence
among many cancelled parameters costs a few forwards, not the verdict of the rest."""
from __future__ import annotations

import math

from .tracking import run_forward

LOSS_RTOL = 1e-9     # relative loss change still counted as "did not move" (float64 rounding)
LOSS_RTOL_FLOAT32 = 1e-5   # the same in float32, for a forward that cannot run in float64 (it makes float32
                           # tensors of its own: torchvision RAFT's coordinate grid); rounding is ~1e-7 there
INVARIANT_GRAD_FACTOR = 1e-4   # a bias gradient below this × its module's weight gradient: a candidate
MAX_SHIFTS = 24      # shifted forwards at most (what is left untested keeps its verdict)


def double(t):
    return t.double() if t.is_floating_point() else t


def cancelled(work, inputs, names: list[str], loss_fn, ctx, rtol: float = LOSS_RTOL) -> set[str]:
    """The `names` the loss does not depend on. `work`: a float64 copy in the mode of the run (stochastic
    depth off); `inputs` in float64 (double); loss_fn a fresh ctx.loss() (the same seeded target)."""
    import torch

    params = dict(work.named_parameters())
    names = [n for n in names if n in params]
    if not names:
        return set()

    def loss():
        with ctx.seeded():
            out = run_forward(work, inputs, phase="forward (re-check on a float64 copy)")
            return loss_fn(out).detach().double().reshape(())

    with torch.no_grad():
        base = loss()

    def moved(group) -> bool:
        with torch.no_grad():
            saved = [params[n].detach().clone() for n in group]
            g = torch.Generator(device=params[group[0]].device).manual_seed(ctx.seed)
            for n in group:
                params[n].add_(torch.randn(params[n].shape, generator=g, device=params[n].device, dtype=params[n].dtype))
            shifted = loss()
            for n, v in zip(group, saved):
                params[n].copy_(v)
        a, b = torch.stack([base, shifted]).tolist()
        return not (math.isfinite(a) and abs(a - b) <= rtol * max(abs(a), 1e-3))

    return bisect(names, moved)


def bisect(names: list[str], moved) -> set[str]:
    """The names whose shift leaves the loss where it was: a group that does not move is cancelled as a
    whole, one that moves is halved (at most MAX_SHIFTS calls of `moved`)."""
    out: set[str] = set()
    stack, shifts = [list(names)], 0
    while stack and shifts < MAX_SHIFTS:
        group = stack.pop()
        shifts += 1
        if not moved(group):
            out |= set(group)
        elif len(group) > 1:
            half = len(group) // 2
            stack += [group[half:], group[:half]]
    return out
