"""param-not-updated: a parameter has .grad but one optimizer step leaves it unchanged (an all-zero
gradient, or the optimizer does not hold it), or the next forward writes it back."""
from __future__ import annotations

from ...core import train
from ...core.tracking import run_forward
from ...results import Result
from .checklist import Checklist

OPTIMIZER_NAMES = {"adam": "Adam", "adamw": "AdamW", "sgd": "SGD"}


def update_check(work, inputs, ctx, ck: Checklist, result: Result) -> None:
    """After backward on `work`: one step of ctx's optimizer (doctor's default: Adam, lr 1e-3)."""
    import torch

    named = list({id(p): (n, p) for n, p in work.named_parameters()}.values())
    trainable = [(n, p) for n, p in named if p.requires_grad]
    with_grad = [(n, p) for n, p in trainable if p.grad is not None]
    no_grad = [n for n, p in trainable if p.grad is None]
    if not with_grad:
        ck.row("update", "skipped", "no parameter received a gradient")
        return
    before = {n: p.detach().clone() for n, p in with_grad}
    zero = {n for n, p in with_grad if not bool(p.grad.detach().ne(0).any())}
    train.step(ctx.optimizer([p for _, p in with_grad]))
    after_step = {n: p.detach().clone() for n, p in with_grad}
    with torch.no_grad():
        run_forward(work, inputs, phase="forward after one optimizer step")
    current = dict(work.named_parameters())
    bad = []
    for n, p in with_grad:
        now = current.get(n, p).detach()
        if n in zero:
            bad.append((n, "receives a gradient, but it is all zeros (a hook, mask or multiplication by 0 "
                           "wipes it), so the optimizer step leaves it unchanged",
                        "find what zeroes the gradient (p.register_hook, grad masks, * 0); freeze it on purpose "
                        "with requires_grad_(False) if it is not meant to train"))
        elif torch.equal(after_step[n], before[n]):
            bad.append((n, "receives a nonzero gradient but the optimizer step does not change it",
                        "check that the optimizer holds this parameter (re-created parameters are not in it)"))
        elif now.shape != after_step[n].shape or not torch.equal(now, after_step[n]):
            reset = now.shape == before[n].shape and torch.equal(now, before[n])
            bad.append((n, "changes after the optimizer step, but the next forward " +
                        ("writes the old value back" if reset else "overwrites it") +
                        " (the forward assigns to the parameter)",
                        "do not assign to parameters in forward (.data =, .copy_, fill_); compute a new tensor "
                        "from the parameter instead"))
    for n, msg, hint in bad[:50]:
        ck.find("update", "param-not-updated", "error", n, f"{n} {msg}", hint,
                verdict=f"{len(bad)} parameter(s) get a gradient but do not change after a step")
    if len(bad) > 50:
        result.notes.append(f"{len(bad) - 50} more param-not-updated parameters not listed")
    if not bad:
        extra = f"; {len(no_grad)} trainable parameter(s) got no gradient (see torchdiag gradflow)" if no_grad else ""
        step = OPTIMIZER_NAMES[ctx.spec.optimizer.name]
        ck.row("update", "ok", f"{len(with_grad)}/{len(with_grad)} params change after 1 {step} step{extra}")
    result.data["params_without_grad"] = no_grad
