"""param-not-updated: a parameter has .grad but one optimizer step leaves it unchanged (an all-zero
gradient, or the optimizer does not hold it), or the next forward writes it back.

An all-zero gradient is by design when it comes from a zero-initialised parameter downstream (a
classifier head or residual BatchNorm scale set to 0): re-checked after the step (the working copy's
forward + backward once more, only when such a parameter exists), those zeros are gone and the
parameter is reported as info `zero-init` naming the zero-initialised module; a real break (a hook or
mask multiplying by 0) stays zero and stays an error."""
from __future__ import annotations

from dataclasses import replace

from ...core import gates, invariance, repeats, train
from ...core import rounding as rounding_rule
from ...core.design import stochastic_depth_off
from ...core.distributed import local_shard
from ...core.rounding import CODE, message, rounded_away, stagnation_counts
from ...core.scaling import stepper
from ...core.tracking import run_forward
from ...core.unreached import (
    NO_GRAD,
    NO_GRAD_HINT,
    NO_GRAD_SEVERITY,
    NOT_REACHED,
    NOT_REACHED_HINT,
    OPEN_SAMPLES,
    ROUTED_HINT,
    SKIPPED_AT_RANDOM,
    by_top_module,
    closed_on_batch,
    in_a_stack,
    never_ran,
    no_grad_message,
    not_reached,
    not_reached_message,
    reached_by_other_draws,
    reached_by_other_inputs,
    routed_message,
    top_module,
)
from ...errors import ModelError
from ...results import Result
from . import gated
from .checklist import Checklist
from .gated import ZERO_GUESS
from .probe import Probe
from .scaled import fit_scale
from .shared import module_of, name, short_dtype

OPTIMIZER_NAMES = {"adam": "Adam", "adamw": "AdamW", "sgd": "SGD"}
MAX_LISTED = 50      # param-not-updated findings listed (the rest counted in a note)


def update_check(probe: Probe) -> None:
    """After backward on probe.work: one step of ctx's optimizer (doctor's default: Adam, lr 1e-3); under
    --amp fp16 through probe.scaler (the backward was scaled; scaled.fit_scale backs off as training would).
    Under torchrun probe.wrapped (wrapped.Wrapped) holds the wrapped copy `work` is the user's module of."""
    work, inputs, ctx, ck, result = probe.work, probe.inputs, probe.ctx, probe.ck, probe.result
    scaler, w = probe.scaler, probe.wrapped
    named = list({id(p): (n, p) for n, p in work.named_parameters()}.values())
    trainable = [(n, p) for n, p in named if p.requires_grad and p.numel()]   # an empty tensor has nothing to train
    with_grad = [(n, p) for n, p in trainable if p.grad is not None]
    no_grad = [n for n, p in trainable if p.grad is None]
    result.data["params_without_grad"] = no_grad
    _report_no_grad(probe, no_grad, len(trainable))
    if not with_grad:
        return
    optimizer = ctx.optimizer([p for _, p in with_grad])
    agreed = (lambda s: w.combine(s, always=True)) if w is not None else None   # every rank backs off alike
    if scaler is not None and not fit_scale(w.model if w else work, inputs, ctx, scaler, optimizer, agreed):
        ck.find("update", "skipped-step", "warning", "", f"the GradScaler skips the step at every loss scale from "
                f"65536 down to {scaler.get_scale():g}: the gradients hold inf/NaN (--amp fp16); the update could "
                "not be checked", f"run `torchdiag nancheck {ctx.option('amp')} fp16` to find the module")
        return
    before = {n: local_shard(p.detach()).clone() for n, p in with_grad}
    grad_nonzero, value_nonzero = _any_nonzero(with_grad, before, w)
    zero = {n for n, _ in with_grad if not grad_nonzero[n]}
    # exactly zero with a non-zero gradient: a zero-initialised parameter (a candidate cause)
    sources = [n for n, _ in with_grad if zero and n not in zero and not value_nonzero[n]]
    train.step(stepper(scaler, optimizer))
    stuck = stagnation_counts(with_grad, before)    # reduced-precision weights only; read with _changes
    after_step = {n: local_shard(p.detach()).clone() for n, p in with_grad}
    failure, forward = _forward_after_step(probe, with_grad, before, after_step)
    moved, kept, reset_to, broken, counts, peer_failed = _changes(
        with_grad, before, after_step, forward, [c for _, c in stuck], w, failure is not None)
    if failure is not None:
        raise failure
    rounding = rounded_away([n for n, _ in stuck], counts, {n: short_dtype(p.dtype) for n, p in with_grad})
    by_design = _recheck(probe, zero, sources) if sources and not peer_failed else {}
    skip = set(by_design) | {r["name"] for r in rounding if not moved[r["name"]]}   # said once, by its own check
    step = OPTIMIZER_NAMES[ctx.spec.optimizer.name]
    if not probe.nonfinite:   # else non-finite-loss said why: the step only carries it on
        _report_nonfinite(broken, dict(with_grad), optimizer, ctx, ck, step)
    renewed = _report_recreated(work, with_grad, ck)
    bad = _not_updated(with_grad, skip | set(broken) | renewed, zero, moved, kept, reset_to)
    # re-checked by behaviour before they are errors (gated.py): a gate at initialisation, or broken?
    # (not the ones the next forward writes back: that is the forward's doing, whatever the gradient)
    suspects = [n for n, _, _ in bad if n in zero or not moved[n]]
    cancelled = gated.invariant(work, before, inputs, ctx, suspects, result, stochastic_depth_off) if suspects and w is None else set()
    suspects = [n for n in suspects if n not in cancelled]
    designed, invariant = gated.recheck(work, before, inputs, ctx, suspects, result, stochastic_depth_off) \
        if suspects and w is None else ({}, set())
    cancelled |= invariant
    bad = [b for b in bad if b[0] not in designed and b[0] not in cancelled]
    kinds = {n: msg for n, msg, _ in bad}    # what happens to each, before where its zero gradient stops is added
    closed: set[str] = set()
    if w is None:   # an all-zero gradient that stays: where it stops (core/stops.py), said in its finding
        selected: set[str] = set()
        bad = gated.with_stops(work, before, inputs, ctx, bad, zero, result, stochastic_depth_off, selected)
        routed = _routed_zeros(probe, before, [n for n, _, _ in bad if n in selected],
                               {n for n, _ in with_grad if n not in zero},
                               [n for n, _, _ in bad if n in zero and n not in selected])
        bad = [b for b in bad if b[0] not in routed]
        closed = _closed_on_batch(probe, before, [n for n, _, _ in bad if n in zero])
        bad = [b for b in bad if b[0] not in closed]
    _report_not_updated(bad, kinds, work, ck, result)
    if not bad and not broken:
        quiet = probe.result.data.get("params_not_reached") or []
        ck.row("update", "ok", f"{len(with_grad) - len(closed)}/{len(with_grad)} params change after 1 {step} step"
               + (f" ({len(quiet)} not reached by the default inputs: not judged)" if quiet else "")
               + (f" ({len(closed)} get a gradient of zeros on this batch alone: closed-on-batch)" if closed else ""))
    _report_rounding(rounding, ctx, step, ck, result)
    _report_zero_init(by_design, sources, ck, result, work)
    gated.report(designed, ck, result, step)


def _report_recreated(work, with_grad, ck: Checklist) -> set[str]:
    """param-recreated (error): after the next forward the model holds a NEW tensor under the name (the
    forward assigns self.w = nn.Parameter(...)): re-initialised every call, and the optimizer, built from
    the old one, never steps the one the model uses. Judged by identity, not by value."""
    now = dict(work.named_parameters())
    renewed = [n for n, p in with_grad if n in now and now[n] is not p]
    for n in renewed:
        ck.find("update", "param-recreated", "error", n, f"{n} is a new parameter after every forward: the forward "
                "creates it (self.… = nn.Parameter(...)), so it is re-initialised each call and the optimizer, which "
                "holds the old one, never trains the one the model uses",
                "create the parameter once in __init__ and only use it in forward",
                verdict=f"{len(renewed)} parameter(s) re-created by every forward")
    return set(renewed)


def _report_no_grad(probe: Probe, no_grad: list[str], total: int) -> None:
    """no-grad (error, as in gradflow and overfit-batch): trainable parameters the backward never reached; those
    whose modules the default inputs torchdiag chose never ran are not-reached (info, core/unreached.py)."""
    work, ck = probe.work, probe.ck
    quiet = [] if probe.wrapped is not None else not_reached(work, probe.inputs, no_grad, probe.ctx)
    # first: a layer LayerDrop skipped is not the default inputs' doing (a sweep: HF autoformer's layerdrop 0.1 was
    # not-reached, and doctor and gradflow named different layers)
    reached = {n for n, p in work.named_parameters() if p.requires_grad and n not in set(no_grad)}
    asked = [n for n in no_grad if n not in set(quiet)] + in_a_stack(quiet, work, reached)
    drawn = _skipped_at_random(probe, asked, reached)
    quiet = [n for n in quiet if n not in drawn]
    probe.result.data["params_not_reached"] = quiet
    for group in by_top_module(quiet, work):
        ck.result.add(NOT_REACHED, "info", top_module(group, work), not_reached_message(group, probe.inputs),
                      NOT_REACHED_HINT)
    no_grad = [n for n in no_grad if n not in set(quiet) and n not in drawn]
    if no_grad:
        ck.find("update", NO_GRAD, NO_GRAD_SEVERITY, top_module(no_grad, work), no_grad_message(no_grad, total),
                NO_GRAD_HINT, verdict=f"{len(no_grad)} of {total} trainable parameter tensor(s) get no gradient",
                members=list(no_grad))     # an allow glob accepts it only when it holds every one


def _skipped_at_random(probe: Probe, names: list[str], ran: set[str]) -> set[str]:
    """Of the no-grad `names`, those another draw of the RNG reaches on a copy (a sweep: Wav2Vec2's LayerDrop 0.1
    skipped layer 1 in doctor's pass, an error in `check`), or fresh inputs of the batch's kind reach (an MoE expert
    a small batch picked none of: core/unreached.reached_by_other_inputs): info, as gradflow says it. A failure of
    the fresh inputs keeps what the draws found. Not under torchrun (every rank would have to draw alike) nor in
    eval mode (nothing is drawn)."""
    if not names or probe.wrapped is not None or not probe.work.training:
        return set()
    from ...core.design import stochastic_depth_off

    try:
        copy = probe.ctx.train_copy(probe.work, "to re-check parameters without a gradient with other random draws",
                                    backward=True)
        stochastic_depth_off(copy)
        # a random .detach() is a cut, not a skip (a review), seen with the judged forward's own draws
        names = never_ran(copy, probe.inputs, names, probe.ctx, probe.rng)
        reached, draws = reached_by_other_draws(copy, probe.inputs, names, probe.ctx) if names else (set(), 0)
    except ModelError as exc:   # no room for a copy, or its forward failed: the verdicts stand
        probe.result.notes.append(f"parameters without a gradient not re-checked with other random draws: {exc.message}")
        return set()
    if reached:
        probe.result.add("skipped-at-random", "info", repeats.common_path(sorted(reached)) or "(root)",
                         f"{len(reached)} parameter tensor(s) ({', '.join(sorted(reached)[:6])}"
                         f"{' …' if len(reached) > 6 else ''}) got no gradient only because the judged pass skipped "
                         f"them at random: {SKIPPED_AT_RANDOM} ({draws} more draw(s) on a copy)")
    try:
        fresh = reached_by_other_inputs(copy, probe.inputs, [n for n in names if n not in reached], probe.ctx, ran)
    except ModelError as exc:   # a fresh batch the forward refuses: the no-grad verdicts stand
        probe.result.notes.append(f"parameters without a gradient not re-checked on fresh inputs: {exc.message}")
        return reached
    if fresh.refused:
        probe.result.notes.append(f"parameters without a gradient re-checked on fresh inputs: {fresh.said()}")
    if fresh.reached:
        probe.result.add("routed-by-input", "info", repeats.common_path(sorted(fresh.reached)) or "(root)",
                         routed_message(sorted(fresh.reached), fresh.runs), hint=ROUTED_HINT)
    return reached | fresh.reached


def _forward_after_step(probe: Probe, with_grad, before, after_step) -> tuple:
    """The forward after the step: does it write the parameters back? (failure, {name: (kept, reset_to)}):
    device flags, the stepped value still there after it / the old value back. Under FSDP the forward's
    own parameters are compared on this rank, whole (the all-gathered ones it started from, the ones it
    left: the root keeps them unsharded), since an edit there never reaches the shards; a failure is
    returned, not raised, so this rank still takes the exchange its peers make next."""
    import contextlib

    import torch

    work, inputs, ctx, w = probe.work, probe.inputs, probe.ctx, probe.wrapped
    seen: dict = {}
    try:
        with torch.no_grad(), ctx.autocast(), (w.forward_inputs(seen) if w and w.sharded else contextlib.nullcontext()):
            run_forward(w.forward_model() if w else work, inputs, phase="forward after one optimizer step")
        failure = None
    except ModelError as exc:
        if w is None or not w.sharded:
            raise
        failure = exc
    now = {n: p.detach() for n, p in work.named_parameters()}
    flags = {}
    for n, p in with_grad:
        t = now.get(n, p.detach())
        if n in seen and not hasattr(t, "to_local"):
            flags[n] = (_equal(t, seen[n]), _equal(w.own_chunk(t), before[n]))
        else:   # this rank's part (unsharded but not seen: a forward that raised before it began)
            t = local_shard(t) if w is None or hasattr(t, "to_local") or not w.sharded else w.own_chunk(t)
            flags[n] = (_equal(t, after_step[n]), _equal(t, before[n]))
    try:
        if w is not None:
            w.resharded()   # after the comparisons: resharding frees the unsharded storage they read
    except Exception:
        if failure is None:
            raise           # else the forward's own error is the one to report, after the exchange
    return failure, flags


def _equal(a, b):
    """As torch.equal, on the device. NaN equals NaN: a NaN the step made is not "overwritten" by the next forward."""
    import torch

    if a.shape != b.shape:
        return torch.zeros((), dtype=torch.bool, device=a.device)
    return ((a == b) | (a.isnan() & b.isnan())).all()


def _routed_zeros(probe: Probe, before: dict, names: list[str], ran: set[str], saturated: list[str]) -> set[str]:
    """Of the `names` whose gradient stays all zeros, stopped by a choice among parts (core/stops Stop.selects), those
    fresh inputs of the batch's kind give a gradient not all zeros on a copy at initialisation (a dense mixture
    multiplying an unpicked expert's output by a routing weight of 0; core/unreached.reached_by_other_inputs):
    routed-by-input (info), as gradflow says it. Not in eval mode."""
    if not names or not probe.work.training:
        return set()
    from ...core.design import stochastic_depth_off
    from .gated import initial_copy

    try:
        copy = initial_copy(probe.work, before, ctx=probe.ctx)
        copy.train()
        stochastic_depth_off(copy)
        fresh = reached_by_other_inputs(copy, probe.inputs, names, probe.ctx, ran, nonzero=True, saturated=saturated)
    except ModelError as exc:   # no room for a copy, or a fresh batch the forward refuses: the errors stand
        probe.result.notes.append(f"parameters with an all-zero gradient not re-checked with fresh inputs: {exc.message}")
        return set()
    if fresh.said():
        probe.result.notes.append(f"parameters with an all-zero gradient re-checked with fresh inputs: {fresh.said()}")
    if fresh.reached:
        probe.result.add("routed-by-input", "info", repeats.common_path(sorted(fresh.reached)) or "(root)",
                         routed_message(sorted(fresh.reached), fresh.runs, zeros=True), hint=ROUTED_HINT)
    return fresh.reached


def _closed_on_batch(probe: Probe, before: dict, names: list[str]) -> set[str]:
    """Of the `names` whose gradient stays all zeros and no routing explains, those most fresh batches of the inputs'
    kind give a gradient on a copy after a short training run (core/unreached.open_elsewhere): a unit on the path
    shut for every sample of this batch alone. closed-on-batch (info), as gradflow says it. Not in eval mode."""
    if not names or not probe.work.training or not probe.inputs.made_up:   # (gradflow's _closed_on_batch: why)
        return set()
    from .gated import initial_copy

    try:
        copy = initial_copy(probe.work, before, ctx=probe.ctx)
        copy.train()
        stochastic_depth_off(copy)
        closed, counts, runs = closed_on_batch(copy, probe.inputs, names, probe.ctx, gates.STEPS)
    except ModelError as exc:   # no room for a copy, or a fresh batch the forward refuses: the errors stand
        probe.result.notes.append(f"parameters with an all-zero gradient not re-checked with fresh inputs after a "
                                  f"short training run: {exc.message}")
        return set()
    if closed:   # (in model order)
        least = min(counts[n] for n in closed)
        probe.result.add("closed-on-batch", "info", repeats.common_path(closed) or "(root)",
                         f"{len(closed)} parameter tensor(s) ({', '.join(closed[:6])}{' …' if len(closed) > 6 else ''})"
                         f" get a gradient of zeros only on this batch: after a short training run on a copy "
                         f"({gates.STEPS} optimizer steps), at least {least} of {runs} fresh batches of "
                         f"{probe.inputs.batch_size} of the inputs' kind give each a gradient, as often as a unit open "
                         f"for {OPEN_SAMPLES:.0%} of samples would; a unit on their path (a ReLU, a gate) is shut for "
                         "every sample of this batch",
                         hint="judge them on more data: --batch, a larger -b", members=closed)
    return set(closed)


def _recheck(probe: Probe, zero, sources) -> dict[str, str]:
    """_zero_init on the working copy; under torchrun on a plain local copy of the wrapped one (no
    collective after it: a rank may take it whatever its peers do; under FSDP the decision is the same
    on every rank, its counts summed, and every rank gathers)."""
    if probe.wrapped is None:
        return _zero_init(probe, zero, sources)
    plain = probe.wrapped.local_copy("to re-check the all-zero gradients on this rank")
    stochastic_depth_off(plain)
    return _zero_init(replace(probe, work=plain), zero, sources)


def _summed(w, scalars: list) -> tuple[list, int]:
    """(scalars, how many ranks' parts each holds): summed over the ranks under FSDP (shards), else as is."""
    if w is None or not w.sharded:
        return scalars, 1
    import torch.distributed as dist

    return w.combine(scalars), dist.get_world_size()


def _report_not_updated(bad: list[tuple[str, str, str]], kinds: dict[str, str], model, ck: Checklist,
                        result: Result) -> None:
    """One param-not-updated error per parameter, or per place repeated block after block (core/repeats.py:
    the same kind (`kinds`: what happens to it) and hint in ≥ 2 blocks of a stack, said once with the first one's
    full message)."""
    verdict = f"{len(bad)} parameter(s) get a gradient but do not change after a step"
    entries = _by_module(repeats.fold([repeats.Entry((kinds[n], hint), n, [(n, msg, hint)]) for n, msg, hint in bad],
                                      model))
    for e in entries[:MAX_LISTED]:
        n, msg, hint = e.members[0]
        names = [m for m, _, _ in e.members]
        if e.folded:
            ck.find("update", "param-not-updated", "error", e.where or "(root)", f"{len(e.members)} parameters, "
                    f"{repeats.describe(e, model)}: as {n}, which {msg}", hint, verdict=verdict, members=names)
        elif len(names) > 1:   # a module's parameters alike (a sweep: weight and bias, two errors word for word)
            ck.find("update", "param-not-updated", "error", e.where, f"{', '.join(names)}: each {msg}", hint,
                    verdict=verdict, members=names)
        else:
            ck.find("update", "param-not-updated", "error", n, f"{n} {msg}", hint, verdict=verdict)
    if len(entries) > MAX_LISTED:
        left = sum(len(e.members) for e in entries[MAX_LISTED:])
        result.notes.append(f"{left} more param-not-updated parameters not listed")


def _by_module(entries: list) -> list:
    """Unfolded entries of one module with the same message and hint, one entry on the module; in order."""
    out: list = []
    at: dict[tuple, int] = {}
    for e in entries:
        n, msg, hint = e.members[0]
        key = (module_of(n), msg, hint)
        if e.folded or key not in at:
            if not e.folded:
                at[key] = len(out)
            out.append(e if e.folded else repeats.Entry(e.key, module_of(n) or "(root)", list(e.members)))
            continue
        out[at[key]].members.extend(e.members)
    return out


def _not_updated(with_grad, skip, zero, moved, kept, reset_to) -> list[tuple[str, str, str]]:
    """(parameter, what happens, hint) for each parameter with a gradient that does not end up changed."""
    bad = []
    for n, _ in with_grad:
        if n in skip:
            continue
        if n in zero:
            bad.append((n, f"receives a gradient, but it is all zeros{ZERO_GUESS}, so the optimizer step leaves it "
                           "unchanged",
                        "find what zeroes the gradient (p.register_hook, grad masks, * 0); freeze it on purpose "
                        "with requires_grad_(False) if it is not meant to train"))
        elif not moved[n]:
            bad.append((n, "receives a nonzero gradient but the optimizer step does not change it",
                        "a step too small for its dtype to add to its value: a gradient that vanishes (a saturated "
                        "gate: `torchdiag gradflow` finds where), or a value so large the step is below its "
                        "resolution; or a parameter the forward re-creates, which the optimizer does not hold"))   # (a review: a sigmoid gate at -22 was told to check the optimizer)
        elif not kept[n]:
            bad.append((n, "changes after the optimizer step, but the next forward " +
                        ("writes the old value back" if reset_to[n] else "overwrites it") +
                        " (the forward assigns to the parameter)",
                        "do not assign to parameters in forward (.data =, .copy_, fill_); compute a new tensor "
                        "from the parameter instead"))
    return bad


def _report_nonfinite(broken: dict[str, int], params: dict, optimizer, ctx, ck: Checklist, step: str) -> None:
    """non-finite-update (error): parameters finite before the step and holding Inf/NaN after it."""
    if not broken:
        return
    names = sorted(broken, key=lambda n: -broken[n])
    shown = ", ".join(f"{n} ({broken[n]:,} of {params[n].numel():,})" for n in names[:6])
    dtype = short_dtype(params[names[0]].dtype)
    why = rounding_rule.adam_underflow(optimizer, dtype)
    lr = ctx.spec.optimizer.learning_rate
    ck.find("update", "non-finite-update", "error", names[0],
            f"{len(names)} parameter(s) hold Inf/NaN after 1 {step} step (lr {lr:g}) from finite values: {shown}"
            + (f" … (+{len(names) - 6} more)" if len(names) > 6 else "") + (f"; why: {why}" if why else ""),
            rounding_rule.nonfinite_hint(ctx, optimizer_option=ctx.spec.caller == "python") if why else
            "the step itself produced Inf/NaN: check the learning rate and the gradients (`torchdiag nancheck`)",
            verdict=f"{len(names)} parameter(s) become Inf/NaN after one step")


def _report_rounding(rounding: list[dict], ctx, step: str, ck: Checklist, result: Result) -> None:
    """update-rounds-away (warning): reduced-precision weights whose update mostly rounded away."""
    if not rounding:
        return
    lr = ctx.spec.optimizer.learning_rate
    ck.find("update", CODE, "warning", rounding[0]["name"], message(rounding, lr, f"1 {step} step"),
            rounding_rule.hint(ctx, lr_option=ctx.spec.caller == "python"),   # no --lr on doctor's command line
            verdict=f"{len(rounding)} {rounding[0]['dtype']} parameter(s): the update rounds away")
    result.data["rounded_away"] = rounding


def _any_nonzero(with_grad, before, w=None) -> tuple[dict, dict]:
    """Per parameter: does its gradient, and does its value, hold a non-zero? Read back together (under
    FSDP: per shard, summed over the ranks first, so every rank judges the whole parameter)."""
    from ...core.readback import read_back

    flags, _ = _summed(w, [local_shard(p.grad).detach().ne(0).any() for _, p in with_grad] +
                       [before[n].ne(0).any() for n, _ in with_grad])
    flags = read_back(flags)
    k = len(with_grad)
    return ({n: f > 0 for (n, _), f in zip(with_grad, flags[:k])},
            {n: f > 0 for (n, _), f in zip(with_grad, flags[k:])})


def _changes(with_grad, before, after_step, forward, counts=(), w=None, failed=False) -> tuple:
    """Per parameter: the step moved it; the next forward kept the stepped value (`forward`'s flags); or
    reset it to the old one. Compared on the device and read back together: one host sync per device,
    not three per parameter. Under FSDP "moved" and "reset to" compare this rank's rows, summed over the
    ranks with the counts (and `failed`: this rank's forward after the step raised) first, so a parameter
    is unmoved when it is on every rank; "kept" is this rank's own (its forward, whole). Returns moved, kept,
    reset_to, broken, the counts' values, and whether the forward after the step failed on a rank."""
    import torch

    from ...core.readback import read_back

    steps = [_equal(after_step[n], before[n]) for n, _ in with_grad]
    resets = [forward[n][1] for n, _ in with_grad]
    # elements the step made non-finite (finite before)
    nonfinite = [(~after_step[n].isfinite() & before[n].isfinite()).sum() for n, _ in with_grad]
    extra = [c.reshape(-1)[i] for c in counts for i in range(c.numel())]   # rounding counts, same read
    tail = [torch.tensor(float(failed), device=w.device)] if w is not None and w.sharded else []
    scalars, parts = _summed(w, steps + resets + nonfinite + extra + tail)
    read = read_back(scalars + [forward[n][0] for n, _ in with_grad])
    k = len(with_grad)
    moved = {n: read[i] < parts for i, (n, _) in enumerate(with_grad)}
    reset_to = {n: read[k + i] >= parts for i, (n, _) in enumerate(with_grad)}
    kept = {n: bool(v) for (n, _), v in zip(with_grad, read[len(scalars):])}
    broken = {n: int(v) for (n, _), v in zip(with_grad, read[2 * k:3 * k]) if v}
    rest = read[3 * k:len(scalars)]
    return moved, kept, reset_to, broken, rest[:len(extra)], bool(tail) and rest[-1] > 0


def _zero_init(probe: Probe, zero, sources) -> dict[str, str]:
    """{parameter: zero-initialised module} for the all-zero gradients that are non-zero after the step:
    one more forward + backward on the working copy (stochastic depth off, as in the judged pass)."""
    import torch

    work, ctx, scaler = probe.work, probe.ctx, probe.scaler
    for p in work.parameters():
        p.grad = None
    with torch.enable_grad():
        with ctx.seeded(), ctx.autocast():
            out = run_forward(work, probe.inputs, phase="forward after one optimizer step (zero-gradient re-check)")
            value = ctx.loss()(out)
        train.backward(scaler.scale(value) if scaler is not None else value, hint="the model's own code raised in backward")
    grads = {n: p.grad for n, p in work.named_parameters()}
    order = {n: i for i, (n, _) in enumerate(work.named_modules())}   # registration order ~ data flow
    src_mods = sorted({module_of(n) for n in sources}, key=lambda m: order.get(m, 0))
    out = {}
    # registration order within a module too (a set's order follows the process's string hashing: ranks differ)
    index = {n: i for i, n in enumerate(grads)}
    grown = _grown(zero, grads)
    for n in sorted(zero, key=lambda n: (order.get(module_of(n), 0), index.get(n, 0))):
        if n in grown:
            out[n] = _gate_module(module_of(n), src_mods, order)
    return out


def _gate_module(mod: str, src_mods: list[str], order: dict) -> str:
    """The zero-initialised module a parameter of `mod` sits upstream of: its own or an ancestor's below the root
    (LoRA's lora_B beside lora_A, ReZero's alpha on the block that holds the attention: a sweep named the next
    block's), else the first registered after it (a bottleneck's last BatchNorm), else the last (the root's own)."""
    ancestors = [m for m in src_mods if m and (m == mod or mod.startswith(m + "."))]
    if ancestors:
        return max(ancestors, key=len)
    at = order.get(mod, 0)   # the root's own zero parameters (an output bias) only when nothing else is there
    return next((m for m in src_mods if m and order.get(m, 0) > at), src_mods[-1])


def _gate_words(e, sources: list[str], model) -> str:
    """What a zero-init finding's parameters sit upstream of: the module and its parameters at zero (a sweep: LoRA's
    was named as the next layer), or each block's own, said once over the stack."""
    blocks = {f"{e.where}.{b}" if e.where else b for b in e.blocks} if e.folded else {e.where}
    own = list(dict.fromkeys(n.rpartition(".")[2] for n in sources if module_of(n) in blocks))
    zero = f"{', '.join(own)} {'is' if len(own) == 1 else 'are'} initialised to exactly zero"
    if e.folded and all(not p for p, _ in e.places):   # the blocks themselves hold the gate (ReZero's alpha)
        return (f"each block's own {', '.join(own)}, at exactly zero: blocks {repeats.ranges(e.blocks)} of "
                f"{e.where or 'the model'}")
    if e.folded:
        return f"each block's own zero-initialised module, {repeats.describe(e, model)}"
    return f"{e.where}, whose {zero}" if own else f"{e.where}, initialised to exactly zero"


def _grown(zero, grads: dict) -> set[str]:
    """The names in `zero` whose gradient is non-zero after the step, beyond rounding. A parameter cancelled
    by a following normalisation gets rounding noise (~1e-9 of its module's other gradients, more or less by
    CPU kernel), which is not a gate opening: below INVARIANT_GRAD_FACTOR of the largest of them it still
    counts as zero."""
    small, norms = invariance.small_in_modules(grads, zero)
    return {n for n in zero if norms.get(n, 0.0) > 0 and n not in small}


def _report_zero_init(by_design: dict[str, str], sources: list[str], ck: Checklist, result: Result, model) -> None:
    if not by_design:
        return
    # each block's own zero-initialised module, once over the stack (a sweep: 16 lines on resnet50), as gradflow
    entries = [repeats.Entry("zero-init", name(src), [n for n, s in by_design.items() if s == src])
               for src in sorted(set(by_design.values()))]
    for e in repeats.fold(entries, model):
        names = list(e.members)
        shown = ", ".join(names[:6]) + (f" … (+{len(names) - 6})" if len(names) > 6 else "")
        where = _gate_words(e, sources, model)
        result.add("zero-init", "info", e.where or "(root)",
                   f"{len(names)} parameter(s) ({shown}) get an all-zero gradient at initialisation, by design: they "
                   f"sit upstream of {where}; after one optimizer step their gradients are non-zero (re-checked on the "
                   "working copy)", members=names if len(names) > 1 else None)
    srcs = sorted(set(by_design.values()))
    ck.row("update", "info", f"every parameter changes or is zero-gradient by design: {len(by_design)} sit upstream "
           f"of zero-initialised {', '.join(name(s) for s in srcs[:3])}{' …' if len(srcs) > 3 else ''} (non-zero "
           "gradient after one step)", name(srcs[0]), "", "zero-init")
