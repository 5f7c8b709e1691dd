"""Re-checks that run the model again, on a copy (ctx.train_copy), and only when a candidate exists:
a healthy pass pays nothing for them. (Exactly-zero and vanishing gradients are re-checked with a short
training run in gated.py.)

- invariant: a parameter whose gradient is below 1e-4 of another gradient of its own module (a bias beside
  its weight, a learnable affine's bias beside its scale), or any flagged one, asked strictly (its gradient
  must sum to rounding where the module's output gradient is healthy: core/invariance.py). On a float64
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
from ...core.device import has_float64, widened
from ...core.fewer import alike, retried
from ...core.invariance import (
    LOSS_RTOL,
    LOSS_RTOL_FLOAT32,
    cancelled,
    double,
    small_beside_siblings,
)
from ...core.tracking import run_forward
from ...core.unreached import (
    NOT_REACHED,
    ROUTED_BY_INPUT,
    SKIPPED_AT_RANDOM,
    in_a_stack,
    reached_by_other_draws,
    reached_by_other_inputs,
)
from ...errors import ModelError
from .params import ORTHOGONAL, mark_scale_invariant

SCALE = 2.0         # the scale test doubles the candidates:
LOSS_STAYS = 0.05   # the loss moves by at most this fraction of itself (ConvMixer: 0.7%, an embedding: 100%),
HALVES = (0.4, 0.625)   # and each gradient's norm is multiplied by about 1/SCALE
MAX_SCALED = 16     # candidates doubled at most (the rest keep exploding-grad)


def cancelled_candidates(rows) -> tuple[list[dict], set[str]]:
    """Rows whose gradient is below INVARIANT_GRAD_FACTOR of another gradient of the same module, and the
    flagged rows besides, asked strictly (invariance.cancelled: a module whose parameters are all starved by
    what follows, cpubone's GroupNorm before a depthwise convolution and a BatchNorm): (rows, strict names)."""
    small = small_beside_siblings({r["name"]: r["grad_norm"] for r in rows})
    flagged = ("vanishing-grad", "zero-grad")
    strict = {r["name"] for r in rows if r["name"] not in small and r["status"] in flagged}
    return [r for r in rows if (r["name"] in small and r["status"] in ("ok", *flagged)) or r["name"] in strict], strict


def recheck(model, inputs, pas, rows, opts, ctx, result) -> None:
    cands, strict = cancelled_candidates(rows) if has_float64(ctx.device) else ([], set())   # mps: no float64
    try:
        _scale_invariant(model, inputs, rows, opts, ctx, result)
    except ModelError as exc:   # no copy, or its forward failed: the exploding verdicts stand
        result.notes.append(f"large orthogonal gradients not re-checked for scale invariance: {exc.message}")
    try:
        if cands:
            agrees = cut_agrees(model, rows, {r["name"] for r in cands}, opts, ctx)
            failed = _invariant_in_float64(model, inputs, cands, strict, opts, ctx, result.notes, agrees)
            if failed is not None:   # a forward that makes float32 tensors of its own, or no room: float32, looser
                if not pas.local:   # (weights made in forward: their own dtype, said as local-weight already)
                    result.notes.append(f"cancelled parameters re-checked in float32 (the float64 copy failed: "
                                        f"{failed})")
                retried(lambda x: _invariant(_copy(model, opts, ctx), x, cands, strict, ctx.loss(), ctx,
                                             LOSS_RTOL_FLOAT32), inputs, ctx, result.notes, "cancelled parameters "
                        "re-checked in float32", agrees)
    except ModelError as exc:   # no copy, or the copy's forward failed: keep the plain verdicts
        result.notes.append(f"cancelled gradients not re-checked on a copy: {exc.message}")
    cands = _drawn_again(model, rows)
    if cands and not opts.eval_mode:
        _skipped_at_random(model, inputs, cands, ran(rows), opts, ctx, result)


def _scale_invariant(model, inputs, rows, opts, ctx, result) -> None:
    """Weights the thresholds call exploding whose gradient is near-orthogonal to them (params.py), asked on a
    copy, each doubled alone: when the loss stays within LOSS_STAYS of itself and the weight's gradient halves
    (within HALVES), the loss ignores its scale, and a step grows |w| instead (timm ConvMixer's convolutions
    before GELU and BatchNorm: the loss -0.08% to -0.7%, gradients x0.505-0.51). An embedding the loss is
    linear in fails (its gradient is near-orthogonal only because it is sparse); so does a weight whose scale
    only another candidate compensates (doubled together they would pass). Cost: 1 + one forward/backward
    pass per candidate (at most MAX_SCALED), only when a candidate exists."""
    import torch

    from ...core.readback import read_back

    cands = [r for r in rows if r["status"] == "exploding-grad" and r["orthogonal"] is not None
             and abs(r["orthogonal"]) <= ORTHOGONAL][:MAX_SCALED]
    if not cands:
        return
    work = _copy(model, opts, ctx)
    params = dict(work.named_parameters())
    cands = [r for r in cands if r["name"] in params]
    names = [r["name"] for r in cands]
    scalars = _loss_and_norms(work, inputs, names, ctx)
    for n in names:
        with torch.no_grad():
            params[n].mul_(SCALE)
        scalars += _loss_and_norms(work, inputs, [n], ctx)
        with torch.no_grad():
            params[n].div_(SCALE)
    values = read_back(scalars)
    l0, g0, doubled = values[0], values[1:len(names) + 1], values[len(names) + 1:]
    confirmed = []
    for r, a, (l1, b) in zip(cands, g0, zip(doubled[::2], doubled[1::2])):
        stays = math.isfinite(l0) and math.isfinite(l1) and abs(l1 - l0) <= LOSS_STAYS * max(abs(l0), 1e-12)
        if stays and a > 0 and HALVES[0] <= b / a <= HALVES[1]:
            confirmed.append(r)
            mark_scale_invariant(r, opts, ctx.spec.optimizer.learning_rate)
    result.notes.append(f"{len(cands)} weight(s) with large gradients orthogonal to them doubled one at a time on a "
                        f"copy ({len(cands) + 1} forward/backward passes): {len(confirmed)} scale-invariant")


def _loss_and_norms(work, inputs, names: list[str], ctx) -> list:
    from ...core import train

    work.zero_grad(set_to_none=True)
    with ctx.seeded():
        loss = ctx.loss()(run_forward(work, inputs, phase="forward (scale re-check, on a copy)"))
    train.backward(loss)
    params = dict(work.named_parameters())
    zero = widened(loss.detach()).reshape(()) * 0
    return [widened(loss.detach()).reshape(())] + [
        widened(params[n].grad.detach()).norm() if params[n].grad is not None else zero for n in names]


def _drawn_again(model, rows) -> list[dict]:
    """The rows another draw of the RNG is asked about: no-grad ones whose module the judged pass never ran (one
    that ran and was cut off is no skip: a review's random `.detach()` was called LayerDrop-like), and not-reached
    ones inside a stack whose siblings ran (a sweep: HF autoformer's layerdrop 0.1 was "not reached by the default
    inputs"; a branch the inputs never feed is not drawn again: core/unreached.in_a_stack)."""
    reached = {r["name"] for r in rows if r["status"] not in ("no-grad", "not-reached", "frozen")}
    unreached = [r["name"] for r in rows if r["status"] == "not-reached"]
    stacked = set(in_a_stack(unreached, model, reached))
    return [r for r in rows if (r["status"] == "no-grad" and r.get("reason") == "unused") or r["name"] in stacked]


def _skipped_at_random(model, inputs, cands, ran: set[str], opts, ctx, result) -> None:
    """no-grad or not-reached parameters (`cands`, rows) that another draw of the RNG reaches
    (core/unreached.reached_by_other_draws): the forward itself chose at random to skip them; then, of the no-grad
    ones left, those fresh inputs of the batch's kind reach (routed-by-input). A parameter neither reaches keeps its
    status; a failure of the fresh inputs keeps what the draws found."""
    try:
        work = _copy(model, opts, ctx)
        reached, draws = reached_by_other_draws(work, inputs, [r["name"] for r in cands], ctx)
    except ModelError as exc:   # no copy, or the copy's forward failed: keep the plain verdicts
        result.notes.append(f"parameters without a gradient not re-checked with other random draws: {exc.message}")
        return
    mark(cands, reached, "skipped-at-random", SKIPPED_AT_RANDOM)
    for r in cands:   # not the inputs' doing alone (a review: a LayerDrop of 1.0 read "with the default inputs")
        if r["status"] == NOT_REACHED and r["name"] not in reached and draws:
            r["why"] = (f"{r['why']}, nor in {draws} other random draw(s) of the forward on a copy (a layer it skips "
                        "in training whatever the inputs, or one it does not use)")
    result.notes.append(f"{len(cands)} parameter tensor(s) without a gradient re-checked on a copy with {draws} "
                        f"other random draw(s): {len(reached)} reached")
    left = [r["name"] for r in cands if r["name"] not in reached and r["status"] == "no-grad"]
    try:
        fresh = reached_by_other_inputs(work, inputs, left, ctx, ran)
    except ModelError as exc:   # a fresh batch the forward refuses: the no-grad verdicts stand
        result.notes.append(f"parameters without a gradient not re-checked on fresh inputs: {exc.message}")
        return
    mark(cands, fresh.reached, "routed-by-input", ROUTED_BY_INPUT)
    if fresh.runs:
        result.notes.append(f"{len(left)} parameter tensor(s) still without a gradient re-checked on {fresh.runs} "
                            f"fresh batch(es) of the inputs' kind: {len(fresh.reached)} reached"
                            + (f"; {fresh.said()}" if fresh.said() else ""))


def ran(rows) -> set[str]:
    """The parameters whose gradient in the judged pass was not zero: the siblings a router chose."""
    return {r["name"] for r in rows if r.get("grad_norm")}


def mark(rows, names: set[str], status: str, why: str) -> None:
    """A by-design status for the rows named in `names`."""
    for r in rows:
        if r["name"] in names:
            r.update(status=status, allowed=False, design={"kind": status, "why": why})


def cut_agrees(model, rows, names, opts, ctx, prepare=stochastic_depth_off):
    """core.fewer.retried's `agrees` for `names`: one float32 forward/backward of a copy on the cut samples, and
    each name's grad/weight there against the judged pass's (core.fewer.alike)."""
    ratios = {r["name"]: _ratio(r["grad_norm"], r["weight_norm"]) for r in rows if r["name"] in names}

    def agrees(fewer) -> str | None:
        import torch

        from ...core import train
        from ...core.readback import read_back

        work = ctx.train_copy(model, "to compare its gradients on fewer samples", _unscaled(model, ctx), backward=True)
        work.train(not opts.eval_mode)
        prepare(work)
        with ctx.seeded(), torch.enable_grad():
            loss = ctx.loss()(run_forward(work, fewer, phase="forward (the first samples, on a copy)"))
            train.backward(loss)
        params = dict(work.named_parameters())
        asked = [n for n in ratios if n in params and params[n].grad is not None]
        got = read_back([v for n in asked for v in (widened(params[n].grad.detach()).norm(),
                                                     widened(params[n].detach()).norm())]) if asked else []
        return alike(ratios, {n: _ratio(g, w) for n, g, w in zip(asked, got[::2], got[1::2])})

    return agrees


def _ratio(grad: float | None, weight: float | None) -> float:
    """grad/weight, or the gradient's norm for a weight of zero (a zero-initialised bias)."""
    return 0.0 if not grad else grad / weight if weight else grad


def _copy(model, opts, ctx, as_double=False):
    import torch

    # the room is checked for the float64 copy it becomes and its gradients: twice the model's float32 bytes each
    # (NoRoom: the float32 re-check follows, said in a note)
    work = ctx.train_copy(model, "to re-check its gradients", torch.float64 if as_double else _unscaled(model, ctx),
                          backward=True)
    work.train(not opts.eval_mode)
    stochastic_depth_off(work)
    return work.double() if as_double else work


def _unscaled(model, ctx):
    """The dtype a re-check copy runs in, given where it differs from the judged pass's: these copies run without
    autocast, so under --amp their activations are the model's own dtype's, not the pass's half ones (room_for_copy
    is asked them in it, without autocast's weight casts); None otherwise."""
    if not ctx.precision.amp:
        return None
    return next((p.dtype for p in model.parameters() if p.is_floating_point()), None)


def _invariant_in_float64(model, inputs, cands, strict, opts, ctx, notes: list, agrees) -> str | None:
    """_invariant on a float64 copy (on half the samples when all of them ran out of memory: core/fewer.py); what
    failed, or None. The float32 attempt that follows a failure starts only after this returns: the error's traceback
    holds the float64 copy and the activations its forward had made (torchvision efficientnet_b7 at 600² under a
    16 GiB cap: float64 ran out of memory deep in the model, and the float32 attempt, made inside the handler, then
    failed at the first convolution)."""
    import gc

    try:
        retried(lambda x: _invariant(_copy(model, opts, ctx, as_double=True), x.map(double), cands, strict, ctx.loss(),
                                     ctx), inputs, ctx, notes, "cancelled gradients re-checked on a float64 copy",
                agrees)
        return None
    except ModelError as exc:
        failed = exc.message
    gc.collect()   # the traceback's frames sit in reference cycles
    return failed


def _invariant(work, inputs, cands, strict, loss_fn, ctx, rtol: float = LOSS_RTOL) -> None:
    cancelled_names = cancelled(work, inputs, [r["name"] for r in cands], loss_fn, ctx, rtol, strict)
    for r in cands:
        if r["name"] in cancelled_names:
            r.update(status="invariant", allowed=False, design={
                "kind": "invariant", "why": "the loss does not change when this parameter is shifted (a following "
                "batch-statistics normalisation or softmax cancels it): its gradient is rounding noise"})
