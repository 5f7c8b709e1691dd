"""Before a vanishing-grad, zero-grad or dead-units verdict is reported above info, it is re-checked by
what the model does (core/gates.py): a short real training run on a copy (the run's loss and optimizer,
the same batch) and, for what grows out of it, the gate found by perturbation — the zero or tiny
multiplicative parameter on the path (a layer scale, a skip-init gain, a zero-initialised residual or
head). Grown out of it: info (`zero-init` for an exactly-zero gradient, else `by-design-init`), naming
the gate and the measured fact; still there: the verdict keeps its level. Runs only when something is
flagged: a healthy pass pays nothing."""
from __future__ import annotations

import math

from ...core import gates
from ...core.fewer import retried
from ...core.module_paths import label, owner
from ...core.train import NoRoom
from ...core.unreached import (
    NOT_REACHED,
    OPEN_SAMPLES,
    ROUTED_BY_INPUT,
    closed_on_batch,
    made_up_padding,
    padding_why,
    reached_by_other_inputs,
)
from ...errors import ModelError
from .dead import zero_edge
from .design import is_tiny, rms
from .recheck import cut_agrees, mark, ran

KIND = "by-design-init"
ADAPTIVE = "adaptive-step"     # a small gradient the optimizer steps like the rest
BOUNDED = "bounded-step"       # a large grad/weight the optimizer does not turn into a large step
INVARIANT = "invariant"       # the loss does not depend on it (a zero gradient back only as rounding)
TRANSIENT = "transient-grad"   # a large gradient of the starting point that a few real steps bring to the others
SMALL = "small-weight"         # a large grad/weight of a weight near zero whose step is the others' or that grew out
LOSS_SCALE = "loss-scale"      # a large gradient the made-up loss's reading of the output's scale makes
TERM = "small-term"            # a large grad/weight of a parameter that is a small part of its module's output
GROWN = "small-normalised"     # a large grad/weight of a small weight whose gradient falls as it grows (grown.py)
CLOSED = "closed-on-batch"     # a zero gradient of this batch alone: fresh inputs give one (after the short run)
CANCELLED = "cancelled"        # a small gradient of a parameter whose move at its module's output the loss ignores
ADAM_EPS = 1e-8                # torch's Adam/AdamW eps, which core.train.make_optimizer keeps


def gated(model, inputs, rows, result, opts, ctx, prepare) -> None:
    flagged = [r for r in rows if r["status"] in ("vanishing-grad", "zero-grad", "exploding-grad") and not r["allowed"]]
    modules = dict(model.named_modules())
    dead = [f for f in result.findings if f.code == "dead-units" and f.severity == "warning" and f.where in modules]
    # a module flagged dead too (ReLU6) is re-checked for that: one verdict per module
    sat = [f for f in result.findings if f.code == "saturated" and f.severity == "warning" and f.where in modules
           and f.where not in {d.where for d in dead}]
    if not flagged and not dead and not sat:
        return
    # judged as params.status judged them: a parameter tiny by construction by its gradient norm
    flags = [gates.Flag(r["name"], r["status"], _threshold(r, opts), by_norm=_by_norm(r, opts), tiny=is_tiny(r))
             for r in flagged]
    flags += [gates.Flag(f.where, "dead-units", opts.dead, zero_edge(modules[f.where])) for f in dead]
    flags += [gates.Flag(f.where, "saturated", opts.saturated, opts.saturation_margin) for f in sat]
    try:
        rc = retried(lambda x: gates.recheck(model, x, flags, ctx, eval_mode=opts.eval_mode, prepare=prepare),
                     inputs, ctx, result.notes, "flagged gradients re-checked with a short training run",
                     _units_whole if dead or sat else cut_agrees(model, rows, {r["name"] for r in flagged}, opts, ctx,
                                                                 prepare))
    except ModelError as exc:   # no copy, or the copy's step/forward failed: keep the plain verdicts
        result.notes.append(f"flagged gradients not re-checked with a short training run: {exc.message}")
        if isinstance(exc, NoRoom):   # said on each verdict: by design or not is what the run would have told
            for r in flagged:
                r["unchecked"] = "no memory for the copy (notes)"
        return
    result.notes.append(f"{len(flags)} flagged finding(s) {rc.cost()}, with {ctx.spec.optimizer.describe()}")
    decoupled = ctx.spec.optimizer.name == "adamw"
    typical = _typical_rms(rows)
    scaled = _loss_scale(model, inputs, flagged, opts, ctx, prepare, result)
    termed = _small_terms(model, inputs, flagged, opts, ctx, prepare, result)
    grown = _grown(model, inputs, flagged, typical, opts, ctx, prepare, result)
    for r in flagged:
        v = rc.verdicts[r["name"]]
        r["rechecked"] = v.steps
        if r["status"] == "exploding-grad":
            if v.resolved and _by_norm(r, opts):   # a transient of the starting point: gone after a few real steps
                r.update(status=TRANSIENT, allowed=False,
                         design={"kind": TRANSIENT, "why": f"{v.describe()} (a short training run on a copy: "
                                                           f"{v.steps} optimizer steps on the same batch, which moved it "
                                                           f"by {v.update:.3g} per element (RMS))"})
                continue
            r["rechecked"] = v.steps if v.compared() else False   # no other parameter moved: nothing compared
            what = v.measure()
            r["recheck_fact"] = (f"{what} {v.after:.3g} after {v.steps} steps, the loss {v.losses[0]:.3g} → "
                                 f"{v.losses[1]:.3g}") + _fell_with_loss(v, _threshold(r, opts))
            if step_claim(r, opts) and v.steps_moderately(v.steps):
                r.update(status=BOUNDED, allowed=False, design={"kind": BOUNDED, "why": moderate_why(v, v.steps, ctx)})
            elif step_claim(r, opts) and _near_zero(r, typical) and v.steps_alike():
                r.update(status=SMALL, allowed=False, design={"kind": SMALL, "why": alike_why(r, v, ctx)})
            elif (why := scaled(r["name"])) is not None:
                r.update(status=LOSS_SCALE, allowed=False, design={"kind": LOSS_SCALE, "why": why})
            elif step_claim(r, opts) and not _loss_rose(v) and (why := termed(r)) is not None:
                r.update(status=TERM, allowed=False, design={"kind": TERM, "why": why})
            elif step_claim(r, opts) and not _blew_up(v) and (why := grown(r)) is not None:
                r.update(status=GROWN, allowed=False, design={"kind": GROWN, "why": why})
            continue
        # the step measured is the optimizer's own, eps included (a gradient far below Adam's eps gets a step
        # far below lr, and does not step normally); only a decoupled weight decay (AdamW) moves a weight
        # without any gradient, so there the gradient must be well above eps for the step to be its
        above_eps = not decoupled or (r["mean_abs_grad"] or 0.0) >= ADAM_EPS
        if not v.by_design and r["status"] == "vanishing-grad" and above_eps and v.steps_normally():
            r.update(status=ADAPTIVE, allowed=False, design={"kind": ADAPTIVE, "why": adaptive_why(v, v.steps, ctx)})
            continue
        if v.invariant:   # back only as rounding noise, and the trained copy's loss does not depend on it
            r.update(status=INVARIANT, allowed=False, design={"kind": INVARIANT, "why": (
                f"max |grad| 0 at initialisation and {_after_run(v)} after a short training run on a copy "
                f"({v.steps} optimizer steps), and shifting it by random values on a float64 copy of the trained "
                "model leaves the loss unchanged: the loss does not depend on it")})
            continue
        if v.rounding:   # back only as rounding noise, though the loss depends on it: said with the zero-grad
            r["rounding_fact"] = (f"max |grad| {v.after:.3g} after it, rounding noise: on a float64 copy its gradient "
                                  "all but vanishes while shifting it moves the loss (a piecewise-constant path: an "
                                  "argmax, a top-k choice, a value normalised to a constant)")
        if v.opens and v.longer is not None:   # still climbing after the short run, its growth compounds
            v = v.longer
            r["rechecked"] = v.steps
        elif v.longer is not None:
            r["longer_fact"] = longer_fact(v)
        if not v.by_design:
            continue
        kind = "zero-init" if r["status"] == "zero-grad" else KIND
        if not v.gates:
            where = r["name"]           # resolved by the run, no single gate isolated
        else:
            where = gate_where(v.gates) if kind == "zero-init" or len(v.gates) > 1 else v.gates[0]
        r.update(status=kind, reason=where, allowed=False,
                 design={"kind": kind, "why": f"{v.describe()} (a short training run on a copy: "
                                              f"{v.steps} optimizer steps on the same batch)"})
    _cancelled(model, inputs, [r for r in flagged if r["status"] == "vanishing-grad"], opts, ctx, prepare, result)
    _locate_stops(model, inputs, [r for r in flagged if r["status"] == "zero-grad"], result, opts, ctx, prepare)
    selected = [r for r in flagged if r["status"] == "zero-grad" and (r.get("stop") or {}).get("selects")]
    saturated = [r["name"] for r in flagged if r["status"] == "zero-grad" and r not in selected]
    _routed_zeros(model, inputs, selected, ran(rows), saturated, result, opts, ctx, prepare)
    _closed_on_batch(model, inputs, [r for r in flagged if r["status"] == "zero-grad"], rc.steps, result, opts, ctx,
                     prepare)
    _transient_saturation(sat, rc)
    for f in dead:
        v = rc.verdicts[f.where]
        if not v.by_design:
            continue
        f.code, f.severity, f.hint = KIND, "info", None
        if v.gates:
            f.message += (f"; by design at initialisation, closed by a gate that training opens: "
                          f"{v.describe()} (a short training run on a copy)")
        else:   # the units' inputs hover near the zero point: they move within the run (no gate needed)
            f.message += (f"; not dead: their inputs hover near the activation's zero point and within a short "
                          f"training run on a copy they stay below the threshold ({v.describe()}; "
                          f"a unit is dead when its input stays below the zero point by more than "
                          f"{gates.MARGIN:g}× the spread of the module's inputs)")


def _cancelled(model, inputs, rows, opts, ctx, prepare, result) -> None:
    """Vanishing gradients the short run left standing, read where the parameter acts (term.cancellations): moved
    along its gradient, the parameter changes its module's output by d, and its gradient is the sum of the terms
    g_i d_i (g = dL/d output). When those terms are large and cancel (their sum under a thousandth of what random
    signs leave), the signal arrives and something after the module takes the change back: `cancelled` (info). A
    scalar gain before a convolution and BatchNorm (timm hgnetv2's learnable affine after each aggregation's first
    convolution; its gradient is eps's share). A gradient small because little arrives where the move lands (a
    chain of sigmoids, an RNN read at a padding step, an output scaled down by a bug) has small terms, not
    cancelled ones: the verdict stands."""
    if not rows:
        return
    from .term import cancellations

    try:
        got = cancellations(model, inputs, [r["name"] for r in rows], ctx, prepare, opts.eval_mode)
    except ModelError as exc:
        result.notes.append(f"vanishing gradients not read where the parameter acts: {exc.message}")
        return
    result.notes.append(f"{len(rows)} vanishing gradient(s) read where the parameter acts: one forward and backward on "
                        "a copy, and one forward per parameter moved")
    for r in rows:
        c = got.get(r["name"])
        if c is not None and c.cancelled():
            r.update(status=CANCELLED, allowed=False, design={"kind": CANCELLED, "why": (
                f"moved along its gradient (on a copy) it changes {label(c.module)}'s output, and the terms "
                f"dL/d output × change there sum to {c.share:.2g} of their magnitudes (over ~{c.terms:.3g} terms; "
                f"random signs would leave ~{c.terms ** -0.5:.2g}): the loss reads what it changes, and something "
                "after the module takes the change back, such as a normalisation dividing out the scale it sets")})


def _units_whole(_fewer) -> str:
    """core.fewer.retried's `agrees` where dead or saturated units are asked: they are judged on the samples
    themselves, and fewer of them may leave a unit dead by chance."""
    return "dead or saturated units are judged on the samples themselves"


def _transient_saturation(findings, rc) -> None:
    """A saturation of the starting point: a few real steps of the run's optimizer bring the module's saturated
    fraction under the threshold as the loss falls below its start (an output sigmoid whose initial logits are
    large); info, with the measured fractions. One still saturated after them stays the warning."""
    for f in findings:
        v = rc.verdicts[f.where]
        if not v.resolved:
            continue
        f.severity, f.hint = "info", None
        f.message += (f"; a transient of the starting point: {v.before:.0%} at initialisation, {v.after:.0%} after "
                      f"{v.steps} steps of a short training run on a copy (the loss {v.losses[0]:.3g} → "
                      f"{v.losses[1]:.3g})")


def _locate_stops(model, inputs, rows, result, opts, ctx, prepare) -> None:
    """Still exactly zero after the run: where their gradient stops (core/stops.py), on a fresh copy. An
    explanation only: whatever goes wrong in it is a note, and the findings stand as they are."""
    if not rows:
        return
    from ...core.stops import stops
    from ...errors import one_line

    try:
        found = stops(gates.fresh_copy(model, ctx, opts.eval_mode, prepare), inputs, [r["name"] for r in rows],
                      ctx, ctx.loss())
    except Exception as exc:
        result.notes.append(f"where the zero gradients stop was not looked for: {one_line(exc)}")
        return
    if found:
        result.notes.append(f"where {len(found)} zero gradient(s) stop: 1 more forward/backward on a copy")
    for r in rows:
        if r["name"] in found:
            stop = found[r["name"]]
            r["stop"] = {"module": stop.module, "why": stop.describe(), "hint": stop.hint(), "selects": stop.selects()}
            if made_up_padding(stop, inputs):   # torchdiag's own ids hit a padding row: not judged
                r.update(status=NOT_REACHED, reason="padding", why=padding_why(stop))


def _routed_zeros(model, inputs, rows, ran: set[str], saturated: list[str], result, opts, ctx, prepare) -> None:
    """Exactly-zero gradients the short run kept, stopped by a choice among parts (core/stops Stop.selects: a part a
    routing op hands back that what reads it leaves out, a multiplication by a value made in the forward that is 0),
    that fresh inputs of the batch's kind make non-zero on a copy (core/unreached.reached_by_other_inputs): a dense
    mixture runs every expert and multiplies the output of one the router picked for no sample of a small batch by 0
    (a hunt: 5 of 8 experts zero-grad errors, batch 3). routed-by-input (info), as an expert left without any
    gradient is; one no input reaches keeps its error. A saturation is not asked: a softmax saturated to one-hot
    passes a gradient for the rare input whose top logits nearly tie. Not in eval mode, as the no-grad re-check."""
    if not rows or opts.eval_mode:
        return
    try:
        fresh = reached_by_other_inputs(gates.fresh_copy(model, ctx, opts.eval_mode, prepare), inputs,
                                        [r["name"] for r in rows], ctx, ran, nonzero=True, saturated=saturated)
    except ModelError as exc:   # no room for a copy, or a fresh batch the forward refuses: the errors stand
        result.notes.append(f"zero gradients not re-checked with fresh inputs: {exc.message}")
        return
    result.notes.append(f"{len(rows)} zero gradient(s) re-checked on a copy with {fresh.runs} fresh batch(es) of the "
                        f"inputs' kind: {len(fresh.reached)} not zero there" + (f"; {fresh.said()}" if fresh.said() else ""))
    mark(rows, fresh.reached, "routed-by-input", ROUTED_BY_INPUT)


def _closed_on_batch(model, inputs, rows, steps: int, result, opts, ctx, prepare) -> None:
    """Exactly-zero gradients the short run kept and no routing explains, that fresh draws of torchdiag's own inputs
    make non-zero on the copy the short run trained (its zero-initialised gates opened first), for at least a quarter
    of the samples (unreached.open_often): a unit on the path shut for every sample of this batch and open for other
    inputs (timm's sehalonet33ts: the 8 ReLU units of a squeeze-excite block all zero on the 2 samples, its two
    linears zero-grad errors, while 2 of 8 are dead on fresh samples). closed-on-batch (info). Not for a user's own
    batch (its mixtures may be inputs the data never has: unreached.open_elsewhere), nor in eval mode."""
    if not rows or opts.eval_mode or not inputs.made_up:
        return
    try:
        closed, counts, runs = closed_on_batch(gates.fresh_copy(model, ctx, opts.eval_mode, prepare, steps=True),
                                               inputs, [r["name"] for r in rows], ctx, steps)
    except ModelError as exc:
        result.notes.append(f"zero gradients not re-checked with fresh inputs after a short training run: {exc.message}")
        return
    if not runs:
        return
    result.notes.append(f"{len(rows)} zero gradient(s) re-checked with {runs} fresh batch(es) of the inputs' kind on a "
                        f"copy after a short training run ({steps} optimizer steps on the batch)")
    for r in rows:
        if r["name"] in closed:
            r.update(status=CLOSED, allowed=False, design={"kind": CLOSED, "why": closed_why(
                counts[r["name"]], runs, inputs.batch_size or 1, steps)})


def closed_why(opened: int, runs: int, batch: int, steps: int) -> str:
    return (f"exactly zero on this batch, still after a short training run on a copy ({steps} optimizer steps), and "
            f"not on fresh inputs of its kind: {opened} of {runs} fresh batches of {batch} give a gradient on that "
            f"copy, as often as a unit open for {OPEN_SAMPLES:.0%} of samples would. A unit on the path (a ReLU, a "
            "gate) is shut for every sample of this batch; judge on more data (--batch, a larger -b)")


def _loss_scale(model, inputs, rows, opts, ctx, prepare, result):
    """A function: why an exploding gradient left after the other re-checks is the made-up loss's reading of the
    output's scale (scale.py), or None. Measured once, for all of them, at the first."""
    from .scale import at_unit_scale

    memo: list = []

    def why(name: str) -> str | None:
        if not memo:
            left = [r["name"] for r in rows if r["status"] == "exploding-grad"]
            try:
                memo.append(at_unit_scale(model, inputs, left, opts, ctx, prepare))
            except ModelError as exc:
                result.notes.append(f"the exploding gradients not re-checked at the output's own scale: {exc.message}")
                memo.append(None)
        got = memo[0]
        if got is None or name not in got.within:
            return None
        read = (f"an output of RMS {got.rms:.3g}; with that output divided by its RMS" if got.divided == 1 else
                f"{got.divided} outputs of RMS up to {got.rms:.3g}; with each divided by its own RMS")
        return (f"the loss is torchdiag's own MSE against a made-up target, on {read} (one more forward and backward "
                f"on a copy: the loss {got.loss:.3g}, its gradients about that RMS squared smaller) this gradient is within --exploding and --exploding-ratio: "
                "it is large because the MSE reads an output of that scale. Adam's step does not depend on it; plain "
                "SGD needs a learning rate about that RMS squared smaller (judge it with the real loss: --batch, --loss)")

    return why


BLEW_UP = 10.0   # the short re-check's loss this many times its start, or not finite: the model blew up


def _blew_up(v) -> bool:
    """The short run's loss ended BLEW_UP times above its start or not finite (a review: a model SGD at lr 0.1 blew
    up, 4.5 -> 2e9, and its small token was passed as small-normalised; a second: a bump of 2 -> 2.05 at Adam 2e-2,
    which the run recovers from, is no blow-up)."""
    l0, l1 = v.losses
    return not (math.isfinite(l1) and l1 <= BLEW_UP * abs(l0))


def _loss_rose(v) -> bool:
    """The short run's loss ended above where it began (or not finite): whatever the ratio where the parameter acts,
    its steps blew the loss up (a review: a module returning a second output the loss never reads, 100× the logits,
    read the move on both; SGD took the loss 1.38 → 7.7e3, and the verdict became small-term, info)."""
    l0, l1 = v.losses
    return not (math.isfinite(l1) and l1 <= l0)


def _small_terms(model, inputs, rows, opts, ctx, prepare, result):
    """A function: why a grad/weight verdict left after the other re-checks is a small part of what its parameter
    acts on (term.py), or None. Measured once, for all of them, at the first asked."""
    from .term import EPS, reaches

    memo: list = []

    def why(r) -> str | None:
        if not memo:
            left = [x["name"] for x in rows if step_claim(x, opts)]
            try:
                memo.append(reaches(model, inputs, left, ctx, prepare, opts.eval_mode))
                result.notes.append(f"{len(left)} large grad/weight ratio(s) read where the parameter acts: one "
                                    f"forward and backward on a copy, and one forward per parameter moved")
            except ModelError as exc:
                result.notes.append(f"large grad/weight ratios not read where the parameter acts: {exc.message}")
                memo.append({})
        got = memo[0].get(r["name"])
        ratio = r["grad_weight_ratio"]
        if got is None:
            return None
        if ratio * got.reach > opts.exploding_ratio:   # said beside the verdict: where it acts, it is as large
            r["acting_fact"] = (
                f"read where it acts ({label(got.module)}'s output, moved along its gradient on a copy) the ratio "
                f"is {ratio * got.reach:.3g}")
            return None
        return (f"grad/weight {ratio:.3g}, yet moved alone against its gradient by {EPS:.0%} of its norm (on a copy) "
                f"it moves {label(got.module)}'s output by {EPS * got.reach:.2g} of that output's norm: read where it "
                f"acts the ratio is {ratio * got.reach:.3g}, within --exploding-ratio {opts.exploding_ratio:g}. The "
                "parameter is a small part of that output (a bias small beside the values it is added to), not its "
                "gradient large")

    return why


def _grown(model, inputs, rows, typical: float, opts, ctx, prepare, result):
    """A function: why a grad/weight verdict left after the other re-checks is a small weight whose gradient falls as
    it grows (grown.py), or None. Measured once, for all those small enough to ask, at the first asked."""
    from .grown import MAX_GROWN, SMALL, at_typical_size, passes

    memo: list = []

    def why(r) -> str | None:
        if not memo:
            sizes = {x["name"]: rms(x) or 0.0 for x in rows if step_claim(x, opts)}
            asked = {n: typical / size for n, size in sizes.items() if size > 0 and typical / size >= SMALL}
            try:
                memo.append(at_typical_size(model, inputs, asked, ctx, prepare, opts.eval_mode) if asked else {})
                if asked:
                    n = min(len(asked), MAX_GROWN)
                    result.notes.append(f"{n} small weight(s) with a large grad/weight ratio scaled alone to the "
                                        f"model's typical size on a copy ({n + 1} forward/backward passes)"
                                        + (f"; {len(asked) - n} more not asked" if len(asked) > n else ""))
            except ModelError as exc:
                result.notes.append(f"small weights not re-checked at the model's typical size: {exc.message}")
                memo.append({})
        g = memo[0].get(r["name"])
        if g is None or not passes(g, opts.exploding_ratio):
            return None
        return (f"grad/weight {r['grad_weight_ratio']:.3g} with a weight of per-element RMS {typical / g.scale:.2g}, "
                f"{1 / g.scale:.2g}x the model's typical {typical:.2g}: scaled alone to that size on a copy, its "
                f"gradient fell {g.fell:.3g}x (at least the square root of the {g.scale:.3g}x scale) and grad/weight "
                f"there is {g.ratio:.3g}, within --exploding-ratio {opts.exploding_ratio:g}. Its gradient is large "
                "because the weight is small behind what divides by its size (a token alone in a pre-norm), not "
                "because anything explodes")

    return why


def _after_run(v) -> str:
    return "still exactly 0" if v.after == 0 else f"{v.after:.3g} (rounding)"


def _threshold(r, opts) -> float:
    if r["status"] == "exploding-grad":
        return opts.exploding if _by_norm(r, opts) else opts.exploding_ratio
    return opts.vanishing


def _fell_with_loss(v, threshold: float) -> str:
    """Why a measure back under its threshold is still no transient: it fell little faster than the loss (fitting
    the batch shrinks every gradient; core/gates.transient asks GROW times the loss's fall). A review read "not a
    transient" beside "3.26 after 3 steps" (CLIP's position embedding, ratio 144 at the start) as a contradiction."""
    l0, l1 = v.losses
    if not (0 < v.after <= threshold and v.before > 0 and l0 > l1 > 0):   # (a loss that rose: no fit to explain it)
        return ""
    return (f" (it fell {v.before / v.after:.3g}x and the loss {l0 / l1:.3g}x: fitting the batch shrinks every "
            "gradient, so only a fall far faster than the loss's tells a transient of the starting point)")


def _by_norm(r, opts) -> bool:
    """Judged by its gradient norm, as params.status judged it: tiny by construction, or an exploding norm."""
    return is_tiny(r) or (r["status"] == "exploding-grad" and not step_claim(r, opts))


def step_claim(r, opts) -> bool:
    """An exploding-grad that is a statement about the step, which the optimizer makes: by grad/weight alone
    (the gradient's norm within --exploding). Not a parameter tiny by construction: a step bounded per element
    can still be a huge change of what it multiplies (a 1e-6 scale used as ×1e7), which a step in weight space
    does not show."""
    return (r["status"] == "exploding-grad" and not is_tiny(r) and r["grad_weight_ratio"] is not None
            and r["grad_norm"] <= opts.exploding)


def moderate_why(v, steps: int, ctx) -> str:
    opt = ctx.spec.optimizer
    sgd = "" if opt.name == "sgd" else (" (with --optimizer sgd the gradient's size is the step, and the verdict "
                                        "is made with it)")
    return (f"grad/weight {v.before:.3g} at initialisation (a plain gradient step at lr {opt.learning_rate:g} would "
            f"move it by {opt.learning_rate * v.before:.2g} of its norm), yet {opt.describe()} moved it by "
            f"{v.relative:.3g} of its norm in {steps} steps on a copy, against a median of {v.median_relative:.3g} "
            f"over the other parameters that moved: the step is bounded, not the gradient{sgd}")


NEAR_ZERO = 0.1   # a weight near zero: its per-element RMS under this × the median over the model's parameters


def _typical_rms(rows) -> float:
    import statistics

    sizes = [s for s in map(rms, rows) if s]   # the parameters that are not all zero
    return float(statistics.median(sizes)) if sizes else 0.0


def _near_zero(r, typical: float) -> bool:
    """Small by chance against the model's own scale (a scalar bias drawn at -0.002 beside weights of ~0.05), not
    a layer of the default scale beside oversized ones (a review: broken_exploding's head at gain 2.6, RMS 0.07
    against hidden layers of 0.32)."""
    size = rms(r)
    return size is not None and typical > 0 and size < NEAR_ZERO * typical


def alike_why(r, v, ctx) -> str:
    start = (f"grad/weight {v.before:.3g} at initialisation from a weight near zero (‖w‖ {r['weight_norm']:.3g}, "
             f"‖grad‖ {r['grad_norm']:.3g})")
    fell = f"the loss fell {v.losses[0]:.3g} → {v.losses[1]:.3g}"
    if v.grew_out():
        return (f"{start}; in {v.steps} steps of {ctx.spec.optimizer.describe()} on a copy the ratio fell to "
                f"{v.after:.3g} as the weight grew away from zero, and {fell}")
    return (f"{start}, yet {ctx.spec.optimizer.describe()} moved each element by {v.update:.3g} (RMS) in {v.steps} "
            f"steps on a copy, against a median of {v.median_update:.3g} over the other parameters that moved, and "
            f"{fell}: the step is like the others', only the weight is small")


def adaptive_why(v, steps: int, ctx) -> str:
    opt = ctx.spec.optimizer
    why = (": an adaptive step does not scale with the gradient while it is well above eps (with plain SGD "
           "it would not learn: --optimizer sgd judges that)") if opt.name.startswith("adam") else ""
    return (f"grad/weight {v.before:.3g} at initialisation, yet {opt.describe()} moved each element by "
            f"{v.update:.3g} (RMS) in {steps} steps on a copy, against a median of {v.median_update:.3g} over the "
            f"other parameters that moved ({v.relative:.3g} of its norm; median {v.median_relative:.3g}){why}")


def longer_fact(v) -> str:
    """What the longer run found where it did not clear the flag."""
    lv = v.longer
    if lv.resolved:
        return (f"given {lv.steps} steps on a fresh copy it reached {lv.after:.3g}, a rise of steps of one size "
                f"(lifted by something else growing, not by its path opening)")
    return f"given {lv.steps} steps on a fresh copy it reached {lv.after:.3g}"


def gate_where(names: list[str]) -> str:
    """Where a gate finding points: the gate's module (one gate), else what the group shares."""
    if len(names) == 1:
        return owner(names[0]) or names[0]
    from os.path import commonprefix

    common = ".".join(commonprefix([n.split(".") for n in names]))
    return common or "(root)"
