"""Is an exploding gradient the made-up loss's scale? torchdiag's own regression loss, an MSE against a unit N(0, 1)
target, reads the output at whatever scale it comes out, and its gradients grow as the square of that scale: the
zoo's mimi and pocket_tts encoders (latents of std 7.8, loss 65.6 and 80.2; a helper's measure: at the output's own
scale nothing was flagged). A real target is at the data's scale, which torchdiag does not know. Asked of the
exploding gradients left after the other re-checks, with the loss auto and an MSE against a target it drew: on a
copy, one forward and backward with the output the loss reads divided by its RMS s (a constant, detached; the loss
and its gradients shrink by about s²), asked only when the loss covers that output alone. A gradient still over the
thresholds at that scale is large whatever the output's scale; one back within them is large because an MSE reads
an output of RMS s: `loss-scale` (info). Adam's step does not depend on the gradient's scale; plain SGD needs a
learning rate about s² smaller. Not asked of an output whose RMS is at most 1 (nothing to
divide) or above MAX_RMS (an output that far off any target's scale is a fault of its own: a stem whose activations
grow 2x a layer), nor under cross-entropy: its gradient at the logits is bounded whatever the labels, so the
made-up labels do not set its scale (a review: a classifier's ratio under SGD is real with any labels)."""
from __future__ import annotations

from dataclasses import dataclass

MAX_RMS = 30.0   # an output this far above a unit target's scale is a finding of its own, not asked about


@dataclass
class Rescaled:
    rms: float            # the RMS of the output the loss reads
    loss: float           # the made-up loss at the output's own scale
    within: set[str]      # the names asked whose gradient is within the thresholds there


def at_unit_scale(model, inputs, names: list[str], opts, ctx, prepare) -> Rescaled | None:
    """The asked `names` whose gradient is within --exploding and --exploding-ratio when the loss reads the outputs
    at unit scale (see the module doc); None when not asked (a loss of the user's or the model's own, an output
    at most unit scale or beyond MAX_RMS, an output structure that cannot be rebuilt)."""
    import torch
    from torch.utils._pytree import tree_map

    from ...core.gates import fresh_copy
    from ...core.loss import primary_output
    from ...core.readback import read_back
    from ...core.tracking import run_forward

    loss_fn = ctx.loss()
    if loss_fn.kind != "auto":
        return None
    work = fresh_copy(model, ctx, prepare=prepare)
    seen: list[float] = []       # the RMS of the output the loss reads
    divided: list[bool] = []     # it was found in the output and divided

    def rescale(mod, args, out):
        y, _ = primary_output(out)
        if not isinstance(y, torch.Tensor) or not y.is_floating_point() or not y.numel():
            return None
        s = float(y.detach().float().pow(2).mean().sqrt())
        seen.append(s)
        if not 1.0 < s <= MAX_RMS:
            return None

        def one(t):   # only the tensor the loss reads (a review: dividing a second output, or the model's own
            if t is not y:   # loss term, hid their own exploding gradients); inside a container tree_map cannot
                return t     # rebuild (a plain dataclass) it stays as it was, and nothing is asked
            divided.append(True)
            return t / s

        return tree_map(one, out)

    handle = work.register_forward_hook(rescale)
    try:
        with torch.enable_grad(), ctx.seeded(), ctx.autocast():
            loss = loss_fn(run_forward(work, inputs, phase="forward (re-check at the output's own scale)"))
    finally:
        handle.remove()
    if not seen or not 1.0 < seen[0] <= MAX_RMS or not divided or not loss_fn.made_target \
            or loss_fn.chosen != "mse" or loss_fn.extra:   # other outputs' terms: not the one scale asked about
        return None
    loss.backward()
    params = dict(work.named_parameters())
    asked = [n for n in names if n in params and params[n].grad is not None]
    norms = read_back([params[n].grad.detach().double().norm() for n in asked]
                      + [params[n].detach().double().norm() for n in asked] + [loss])
    grads, weights, value = norms[:len(asked)], norms[len(asked):2 * len(asked)], norms[-1]
    within = {n for n, g, w in zip(asked, grads, weights)
              if g <= opts.exploding and (w == 0 or g / w <= opts.exploding_ratio)}
    return Rescaled(seen[0], value, within)
