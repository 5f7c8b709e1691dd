"""Is an exploding gradient the made-up loss's scale? torchdiag's own regression loss, an MSE against a unit N(0, 1)
target, reads the output at whatever scale it comes out, and its gradients grow as the square of that scale: the
zoo's mimi and pocket_tts encoders (latents of std 7.8, loss 65.6 and 80.2; a helper's measure: at the output's own
scale nothing was flagged). A real target is at the data's scale, which torchdiag does not know. Asked of the
exploding gradients left after the other re-checks, with the loss auto and an MSE against a target it drew: on a
copy, one forward and backward with each output the loss reads divided by its own RMS s (a constant, detached, over
the values that are not fills: an OWL-ViT's finfo.min over padded queries stays, and the loss leaves it out; the
loss and its gradients shrink by about s²), asked only when every term of the loss is a made-up MSE (a review: a
detector's logits and boxes, two terms, were never asked). A gradient still over the
thresholds at that scale is large whatever the output's scale; one back within them is large because an MSE reads
an output of RMS s: `loss-scale` (info). Adam's step does not depend on the gradient's scale; plain SGD needs a
learning rate about s² smaller. Not asked of an output whose RMS is at most 1 (nothing to
divide) or above MAX_RMS (an output that far off any target's scale is a fault of its own: a stem whose activations
grow 2x a layer), nor under cross-entropy: its gradient at the logits is bounded whatever the labels, so the
made-up labels do not set its scale (a review: a classifier's ratio under SGD is real with any labels)."""
from __future__ import annotations

from dataclasses import dataclass

from ...core.device import widened

MAX_RMS = 30.0   # an output this far above a unit target's scale is a finding of its own, not asked about


@dataclass
class Rescaled:
    rms: float            # the RMS of the output the loss reads
    loss: float           # the made-up loss at the output's own scale
    within: set[str]      # the names asked whose gradient is within the thresholds there
    divided: int = 1      # the outputs divided (each by its own RMS)


def at_unit_scale(model, inputs, names: list[str], opts, ctx, prepare) -> Rescaled | None:
    """The asked `names` whose gradient is within --exploding and --exploding-ratio when the loss reads the outputs
    at unit scale (see the module doc); None when not asked (a loss of the user's or the model's own, an output
    at most unit scale or beyond MAX_RMS, an output structure that cannot be rebuilt)."""
    import torch
    from torch.utils._pytree import tree_map

    from ...core.fills import as_extreme_as_a_fill
    from ...core.gates import fresh_copy
    from ...core.loss import float_outputs
    from ...core.readback import read_back
    from ...core.tracking import run_forward

    loss_fn = ctx.loss()
    if loss_fn.kind != "auto":
        return None
    work = fresh_copy(model, ctx, prepare=prepare)
    seen: dict[str, float] = {}   # label -> the RMS of each floating output, its fills left out
    divided: set[str] = set()     # the outputs found and divided

    def rescale(mod, args, out):
        labels = {id(t): label for label, t in float_outputs(out) if t.numel()}
        seen.update(_rms({label: t for label, t in float_outputs(out) if id(t) in labels}))

        def one(t):   # inside a container tree_map cannot rebuild (a plain dataclass) it stays as it was, and
            label = labels.get(id(t)) if isinstance(t, torch.Tensor) else None   # nothing is asked
            if label is None or not 1.0 < seen[label] <= MAX_RMS:
                return t
            divided.add(label)   # a fill (finfo.min over a padded query) stays what it is: the loss leaves it out
            return torch.where(as_extreme_as_a_fill(t) & torch.isfinite(t) | ~torch.isfinite(t), t, t / seen[label])

        return tree_map(one, out)

    handle = work.register_forward_hook(rescale)
    try:
        with torch.enable_grad(), ctx.seeded(), ctx.autocast():
            loss = loss_fn(run_forward(work, inputs, phase="forward (re-check at the output's own scale)"))
    finally:
        handle.remove()
    read = _mse_terms(loss_fn)
    if not read or not seen or not divided & read or any(not seen.get(label, 0.0) <= MAX_RMS for label in read):
        return None   # the user's or the model's own term read a divided output, or one far off any target's scale
    loss.backward()
    params = dict(work.named_parameters())
    asked = [n for n in names if n in params and params[n].grad is not None]
    norms = read_back([widened(params[n].grad.detach()).norm() for n in asked]
                      + [widened(params[n].detach()).norm() for n in asked] + [loss])
    grads, weights, value = norms[:len(asked)], norms[len(asked):2 * len(asked)], norms[-1]
    within = {n for n, g, w in zip(asked, grads, weights)
              if g <= opts.exploding and (w == 0 or g / w <= opts.exploding_ratio)}
    return Rescaled(max(seen[label] for label in divided & read), value, within, len(divided & read))


def _rms(outputs: dict) -> dict[str, float]:
    """label -> the RMS of each output over its values that are not fills (finite, less extreme than one), read back
    once."""
    import torch

    from ...core.fills import as_extreme_as_a_fill
    from ...core.readback import read_back

    def rms(t):
        t = t.detach().float()
        kept = torch.isfinite(t) & ~as_extreme_as_a_fill(t)
        return t.where(kept, 0.0).pow(2).sum().div(kept.sum().clamp(min=1)).sqrt()

    return dict(zip(outputs, read_back([rms(t) for t in outputs.values()]))) if outputs else {}


def _mse_terms(loss_fn) -> set[str]:
    """The outputs the auto loss read with an MSE against a target it drew: every term of it, or an empty set when
    one is not (a cross-entropy, the model's own loss term: its scale is not the made-up target's)."""
    if not loss_fn.made_target or loss_fn.chosen != "mse":
        return set()
    terms = [(loss_fn.picked, "mse")] + [(label, rule) for label, rule, _ in loss_fn.extra or ()]
    return {label for label, rule in terms} if all(rule in ("mse", "same") for _, rule in terms) else set()
