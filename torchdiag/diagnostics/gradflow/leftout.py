"""Is a vanishing gradient the made-up loss's choice of outputs? The auto loss leaves out an output whose every
weight the first output's graph already reaches (core/loss.py `_reached_through`): it would train nothing new.
Reach says nothing of strength: conditional DETR returns `reference_points`, a sigmoid of `ref_point_head` that its
detection head adds to the box logits, and through the decoder alone that head's first weight gets a grad/weight of
2.5e-8, while an MSE on `reference_points` gives it 3.6e-4 (a helper's measure). Asked of the vanishing gradients
left after the other re-checks, with the loss auto: on a copy, one forward and backward of a made-up MSE on the
outputs left out alone (each against its own N(0, 1) target, fills left out). A gradient above --vanishing there
is `left-out-output` (info): the path is weak only towards the output the loss read, and strong towards one a head
or a loss of the user's may read. One still below is vanishing on both paths, and stays a warning."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Through:
    outputs: list[str]          # the outputs the made-up loss left out, read here
    ratios: dict[str, float]    # name -> its grad/weight (grad norm for an all-zero weight) there, at or above
                                # --vanishing


def through_left_out(model, inputs, names: list[str], opts, ctx, prepare) -> Through | None:
    """The asked `names` whose gradient is at or above --vanishing through the outputs the auto loss left out (see
    the module doc); None when not asked (a loss of the user's, nothing left out)."""
    import torch
    import torch.nn.functional as F

    from ...core.fills import as_extreme_as_a_fill
    from ...core.gates import fresh_copy
    from ...core.loss import float_outputs
    from ...core.readback import read_back
    from ...core.tracking import run_forward

    loss_fn = ctx.loss()
    if loss_fn.kind != "auto":
        return None
    work = fresh_copy(model, ctx, opts.eval_mode, prepare)
    with torch.enable_grad(), ctx.seeded(), ctx.autocast():
        out = run_forward(work, inputs, phase="forward (re-check through the outputs the made-up loss leaves out)")
        loss_fn(out)   # which outputs it leaves out, decided on its first call
        outs = dict(float_outputs(out))
        left = [(label, outs[label]) for label in sorted(loss_fn.reached_already or ())
                if label in outs and outs[label].requires_grad and outs[label].numel()]
        if not left:
            return None
        g = torch.Generator().manual_seed(ctx.seed)
        terms = []
        for _, t in left:
            target = torch.randn(t.shape, generator=g).to(t.device)
            y = t.float()
            kept = torch.isfinite(y) & ~as_extreme_as_a_fill(y)   # a fill is no value a weight can fit
            terms.append(F.mse_loss(torch.where(kept, y, target), target))
    torch.stack(terms).sum().backward()
    params = dict(work.named_parameters())
    asked = [n for n in names if n in params and params[n].grad is not None]
    norms = read_back([params[n].grad.detach().double().norm() for n in asked]
                      + [params[n].detach().double().norm() for n in asked])
    grads, weights = norms[:len(asked)], norms[len(asked):]
    ratios = {n: (gn / w if w else gn) for n, gn, w in zip(asked, grads, weights)}
    return Through([label for label, _ in left], {n: r for n, r in ratios.items() if r >= opts.vanishing})
