"""param-not-updated re-checked by behaviour before it is an error (issue 26; core/gates.py): a parameter
whose gradient is all zeros, or so small that the step rounds away, is judged again after a short real
training run on a copy of the model at initialisation (the run's optimizer, the same batch). When the
run makes it move and a gate explains it — a zero or tiny multiplicative parameter on its path (layer
scale, skip-init gain, zero-initialised residual or head), found by perturbation — it is info
`by-design-init` naming the gate; otherwise the error stays."""
from __future__ import annotations

from ...core import gates, invariance
from ...core.device import has_float64
from ...core.unreached import (
    NOT_REACHED,
    NOT_REACHED_HINT,
    made_up_padding,
    padding_why,
)
from ...errors import ModelError
from .shared import name

CODE = "by-design-init"
ZERO_GUESS = " (a hook, mask or multiplication by 0 wipes it)"   # param-not-updated's guess, until a stop is found


def initial_copy(work, before: dict, dtype=None, ctx=None):
    """A copy of the stepped working copy with the values it had before the step put back; its room is
    checked in `dtype` when the caller will cast it, with its gradients and the activations a pass keeps
    (ctx.activation_bytes) when the caller gives the run's `ctx` to run backward on it."""
    import torch

    from ...core.train import train_copy

    init = train_copy(work, "to re-check parameters that did not move", dtype, backward=ctx is not None,
                      activations=ctx.activation_bytes(dtype) if ctx is not None else None)
    with torch.no_grad():
        for n, p in init.named_parameters():
            if n in before and before[n].shape == p.shape:
                p.copy_(before[n])
    return init


def recheck(work, before, inputs, ctx, names: list[str], result, prepare) -> tuple[dict, set[str]]:
    """({parameter: gates.Verdict} for the `names` (not updated) that grow out of it by design, the names the trained
    copy's loss does not depend on: their gradient came back at rounding level once the gate opened, and a step that
    "moved" them was Adam normalising that rounding (a sweep: gmixer's token-MLP biases, cancelled by LayerNorms
    behind a zero-initialised head, were called gated)."""
    if not names:
        return {}, set()
    flags = [gates.Flag(n, "param-not-updated") for n in names]
    try:
        rc = gates.recheck(initial_copy(work, before), inputs, flags, ctx, prepare=prepare)
    except ModelError as exc:
        result.notes.append(f"parameters that did not move not re-checked with a short training run: {exc.message}")
        return {}, set()
    result.notes.append(f"{len(flags)} parameter(s) that did not move {rc.cost()}")
    if rc.invariance:
        result.notes.append(rc.invariance)
    found = {n for n, v in rc.verdicts.items() if v.invariant}
    _say_invariant(result, found, f" trained for {rc.steps} optimizer steps (the gate in front of them open)")
    return {n: v for n, v in rc.verdicts.items() if v.by_design}, found


def with_stops(work, before, inputs, ctx, bad: list, zero: set, result, prepare, selected: set | None = None) -> list:
    """The (name, message, hint) entries whose gradient is all zeros, told where it stops (core/stops.py), on a
    copy at initialisation; the others as they are. `selected` gets the names stopped by a choice among parts an input
    can change (Stop.selects)."""
    names = [n for n, _, _ in bad if n in zero]
    if not names:
        return bad
    from ...core.stops import stops
    from ...errors import one_line

    try:
        init = initial_copy(work, before, ctx=ctx)
        init.train(work.training)
        prepare(init)
        found = stops(init, inputs, names, ctx, ctx.loss())
    except Exception as exc:   # an explanation only: the findings stand as they are
        why = exc.message if isinstance(exc, ModelError) else one_line(exc)
        result.notes.append(f"where the zero gradients stop was not looked for: {why}")
        return bad
    if found:
        result.notes.append(f"where {len(found)} zero gradient(s) stop: 1 more forward/backward on a copy")
    if selected is not None:
        selected.update(n for n, stop in found.items() if stop.selects())
    padded = [n for n in names if n in found and made_up_padding(found[n], inputs)]
    for n in padded:   # made-up ids that hit a padding row say nothing of the model: not judged
        result.add(NOT_REACHED, "info", n, f"{n} does not change after the step: {padding_why(found[n])} with the "
                   f"default inputs torchdiag chose ({inputs.source}); not judged", NOT_REACHED_HINT)
        result.data.setdefault("params_not_reached", []).append(n)
    # where it stops is the cause: the generic guess goes (a sweep: a dead ReLU led with "a hook, mask or * 0")
    return [(n, f"{msg.replace(ZERO_GUESS, '')}; {found[n].describe()}", found[n].hint()) if n in found
            else (n, msg, hint) for n, msg, hint in bad if n not in padded]


def invariant(work, before, inputs, ctx, names: list[str], result, prepare) -> set[str]:
    """The `names` (not updated) the loss does not depend on at all (core/invariance.py: a bias cancelled by a
    following batch-statistics normalisation or softmax): no step can move them, by design. Tested on a float64
    copy at initialisation, in the run's mode; on mps (no float64) nothing is."""

    names = _candidates(work, names)
    if not names or not has_float64(ctx.device):
        return set()
    try:
        found = _cancelled_in_float64(work, before, inputs, ctx, names, prepare, widen=False)
    except ModelError:   # a floating tensor kept as a plain attribute (mimi's cached codebook) met float64: cast it
        try:             # too; asked second (a review: one scattered into a float32 tensor made in forward broke)
            found = _cancelled_in_float64(work, before, inputs, ctx, names, prepare, widen=True)
        except ModelError as exc:
            result.notes.append(f"parameters that did not move not re-checked for invariance: {exc.message}")
            return set()
    _say_invariant(result, found, "")
    return found


def _cancelled_in_float64(work, before, inputs, ctx, names: list[str], prepare, widen: bool) -> set[str]:
    import torch

    copy = initial_copy(work, before, torch.float64, ctx)
    copy = invariance.float64_copy(copy) if widen else copy.double()
    copy.train(work.training)
    prepare(copy)
    return invariance.cancelled(copy, inputs.map(invariance.double), names, ctx.loss(), ctx)


def _say_invariant(result, found: set[str], when: str) -> None:
    if not found:
        return
    shown = sorted(found)
    listed = ", ".join(shown[:6]) + (f" … (+{len(shown) - 6})" if len(shown) > 6 else "")
    result.add("invariant", "info", name(_common(shown)) if len(shown) > 1 else shown[0],
               f"{len(shown)} parameter(s) ({listed}) do not change after a step, by design: the loss does not "
               f"depend on them (shifting them by random values on a float64 copy{when} leaves it unchanged within "
               "1e-9 of itself, as when a following normalisation or softmax cancels them)")
    # (a zoo re-run: edgenext's XCA temperature over near-uniform attention moves the loss by 2e-12: not cancelled,
    # below what the test tells from rounding; the message says what was measured)


def _candidates(work, names: list[str]) -> list[str]:
    """The `names` whose gradient is below INVARIANT_GRAD_FACTOR of another gradient of the same module
    (core/invariance.small_beside_siblings): what a following normalisation cancels. A parameter behind a tiny
    gate has a tiny gradient with its siblings alike, and a loss that moves too little to tell: the short
    training run judges it."""
    small, _ = invariance.small_in_modules({n: p.grad for n, p in work.named_parameters()}, names)
    return [n for n in names if n in small]


def report(by_design: dict, ck, result, step: str) -> None:
    """One info finding per gate; the update row says so when nothing else is wrong."""
    groups: dict[tuple, list] = {}
    for n, v in by_design.items():
        groups.setdefault(tuple(v.gates), []).append((n, v))
    for gate, members in groups.items():
        names = [n for n, _ in members]
        shown = ", ".join(names[:6]) + (f" … (+{len(names) - 6})" if len(names) > 6 else "")
        n, v = members[0]
        where = (gate[0] if len(gate) == 1 else name(_common(gate))) if gate else n
        result.add(CODE, "info", where,
                   f"{len(names)} parameter(s) ({shown}) do not change after 1 {step} step at initialisation, by "
                   f"design: their gradient is closed by a gate that training opens; after a short training run on a "
                   f"copy ({v.steps} optimizer steps, same batch) they move: {n}: {v.describe()}")
    if by_design:
        ck.row("update", "info", f"{len(by_design)} parameter(s) do not move at initialisation, by design (a gate "
               "training opens; see the info findings)", name(next(iter(by_design))), "", CODE)


def _common(names) -> str:
    from os.path import commonprefix

    return ".".join(commonprefix([n.split(".") for n in names]))
