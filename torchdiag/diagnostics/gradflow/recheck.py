"""Re-checks that run the model again, on a copy (ctx.train_copy), and only when a candidate exists:
a healthy pass pays nothing for them. (Exactly-zero and vanishing gradients are re-checked with a short
training run in gated.py.)

- invariant: a bias whose gradient is below 1e-4 of its own module's weight gradient. On a float64
  copy, shifted by a random vector (one value per element, so a softmax's invariance to one constant
  added to every logit does not count), with the same seeded forward: when the loss does not move
  (relative change < 1e-9, far above float64 rounding, far below any real dependence), the loss does
  not depend on it (a following batch-statistics normalisation, or a softmax over the dimension it is
  constant in, cancels it) and its gradient is rounding noise. All candidates are shifted together first;
  a group that moves the loss is halved, so one real dependence among many cancelled biases (RAFT's
  feature encoder: 15 biases before InstanceNorm) costs a few forwards, not the verdict of the rest."""
from __future__ import annotations

import math

from ...core.design import stochastic_depth_off
from ...core.tracking import run_forward
from ...errors import ModelError

INVARIANT_GRAD_FACTOR = 1e-4    # bias gradient below this × its module's weight gradient: a candidate
LOSS_RTOL = 1e-9                # relative loss change still counted as "did not move" (float64 rounding)
MAX_SHIFTS = 24                 # shifted forwards at most: groups halved until each moves the loss or does not


def bias_candidates(rows) -> list[dict]:
    by_name = {r["name"]: r for r in rows}
    out = []
    for r in rows:
        if r["status"] not in ("ok", "vanishing-grad") or not r["name"].endswith("bias"):
            continue
        w = by_name.get(r["name"][: -len("bias")] + "weight")
        if (w and w["grad_norm"] and math.isfinite(w["grad_norm"]) and r["grad_norm"] is not None
                and r["grad_norm"] < INVARIANT_GRAD_FACTOR * w["grad_norm"]):
            out.append(r)
    return out


def recheck(model, inputs, pas, rows, opts, ctx, result) -> None:
    biases = bias_candidates(rows) if ctx.device.type != "mps" else []   # mps has no float64
    try:
        if biases:
            _invariant(_copy(model, opts, ctx, double=True), inputs.map(_double), biases, ctx.loss(), ctx)
    except ModelError as exc:   # no copy, or the copy's forward failed: keep the plain verdicts
        result.notes.append(f"cancelled gradients not re-checked on a copy: {exc.message}")


def _copy(model, opts, ctx, double=False):
    work = ctx.train_copy(model, "to re-check its gradients")
    work.train(not opts.eval_mode)
    stochastic_depth_off(work)
    return work.double() if double else work


def _double(t):
    return t.double() if t.is_floating_point() else t


def _loss(work, inputs, loss_fn, ctx):
    with ctx.seeded():
        return loss_fn(run_forward(work, inputs, phase="forward (re-check on a copy)")).detach().double().reshape(())


def _invariant(work, inputs, cands, loss_fn, ctx) -> None:
    import torch

    params = dict(work.named_parameters())

    def moved(names) -> bool:
        with torch.no_grad():
            saved = [params[n].detach().clone() for n in names]
            g = torch.Generator(device=params[names[0]].device).manual_seed(ctx.seed)
            for n in names:
                params[n].add_(torch.randn(params[n].shape, generator=g, device=params[n].device,
                                           dtype=params[n].dtype))
            shifted = _loss(work, inputs, loss_fn, ctx)
            for n, v in zip(names, saved):
                params[n].copy_(v)
        a, b = torch.stack([base, shifted]).tolist()
        return not (math.isfinite(a) and abs(a - b) <= LOSS_RTOL * max(abs(a), 1e-3))

    with torch.no_grad():
        base = _loss(work, inputs, loss_fn, ctx)
    cancelled = _bisect([r["name"] for r in cands], moved)
    for r in cands:
        if r["name"] in cancelled:
            r.update(status="invariant", allowed=False, design={
                "kind": "invariant", "why": "the loss does not change when this bias is shifted (a following "
                "batch-statistics normalisation or softmax cancels it): its gradient is rounding noise"})


def _bisect(names: list[str], moved) -> set[str]:
    """The names whose shift leaves the loss where it was: a group that does not move is cancelled as a
    whole, one that moves is halved (at most MAX_SHIFTS forwards; what is left untested keeps its verdict)."""
    cancelled: set[str] = set()
    stack, shifts = [names], 0
    while stack and shifts < MAX_SHIFTS:
        group = stack.pop()
        shifts += 1
        if not moved(group):
            cancelled |= set(group)
        elif len(group) > 1:
            half = len(group) // 2
            stack += [group[half:], group[:half]]
    return cancelled
