"""The overfit-batch Result: header, data and series, summary lines, the cause findings and the verdict."""
from __future__ import annotations

import math
from typing import Any

from ...errors import ExitCode
from ...results import Result
from .causes import floor_of, real_beyond, terms_within
from .options import OPTIMIZER
from .trend import CONSTANT_TIMES, MIN_STEPS, PLATEAU_REL, Trend, goal_of, judge

FLAT_REL = 1e-3          # best loss within 0.1% of the initial loss: "flat from the start"
ROSE_REL = 0.1           # ... unless it rose more than 10% above it on the way: it moved, upwards
MINOR_SHARE = 0.1        # updates that round away in fewer of the trainable elements cannot stop a fall alone
NEAR_GOAL = 2.0          # with a cause found, a fall is not yet a failure only within this factor of the target


def describe_optimizer(spec) -> str:
    """How the header has always named the optimizer (torch's class, and what differs from its defaults)."""
    if spec.name == "sgd":
        return f"SGD (momentum {spec.momentum:g})" if spec.momentum else "SGD"
    return "AdamW (weight_decay 0.01)" if spec.name == "adamw" else "Adam"


def _fmt(v) -> str:
    return "—" if v is None else f"{v:.6g}"


def _names(names: list[str], limit: int) -> str:
    return ", ".join(names[:limit]) + (f" … (+{len(names) - limit} more)" if len(names) > limit else "")


def build(trainer, curve, causes, opts, ctx, second=None, few=None, lower=None, held=None, wide=None) -> Result:
    """`second`: a callable that trains a fresh copy with the default optimizer (its Curve, or None), asked only
    when the run fails or ends still falling toward the target. `few`: one that trains a fresh copy on two of the
    batch's samples (capacity.Few, or None), asked only when the run fails with no cause found. `held`: one that
    trains a fresh copy with the same random draws at every step (draws.py), asked only then too. `wide`: one that
    trains a float32 copy for as many steps (its Curve, or None), asked only when the run fails with updates that
    round away its one cause (_rounding_held)."""
    result = Result("overfit-batch")
    _header_and_data(result, trainer, curve, opts, ctx)
    _summary(result, curve, opts)
    if curve.interrupted:
        result.code = int(curve.interrupted)   # 130 (Ctrl-C) or 143 (SIGTERM)
        result.verdict = (f"INTERRUPTED after {curve.step} step(s): partial result "
                          f"(loss {_fmt(result.data['initial_loss'])} → {_fmt(result.data['final_loss'])})")
        how = "SIGTERM" if curve.interrupted == ExitCode.TERMINATED else "Ctrl-C"
        result.notes.append(f"interrupted with {how}: no verdict; the numbers above are up to the last step")
        return result
    if curve.peer_stop:   # under torchrun with a wrapper: the stop is every rank's
        result.notes.append(curve.peer_stop)
    found = _cause_findings(result, trainer, curve, causes, opts)
    if found == 1 and _rounding_decides(trainer, causes) and not _rounding_held(result, curve, wide):
        found = 0
    if _at_bounded_floor(result, causes, opts, ctx):
        return result
    rose = any(f.code == "loss-rose" for f in result.findings)   # a rate too large is what the lower rate asks
    if found - rose == 1 and _at_a_lower_rate(result, curve, ctx, lower):   # (identical-outputs the other cause)
        result.findings = [f for f in result.findings if f.code != "loss-rose"]   # lr-too-large says it
    else:
        _verdict(result, trainer, curve, opts, ctx, found, second, few, causes.own_floor, causes.out_of_range,
                 causes.term_floors, held, causes.batch_floor, causes.nonneg)
    return result


def _at_a_lower_rate(result, curve, ctx, lower) -> bool:
    """A run that failed with outputs training made identical, nothing else found (__init__._collapsed): the same on a
    fresh copy at a 10x smaller learning rate. Memorised there: the step was too large for this model, a warning
    naming the rate that works, and no cannot-overfit. Not memorised: the run's verdict stands, with a note."""
    from ...errors import ModelError
    from . import LOWER

    d = result.data
    if d["passed"] or lower is None:
        return False
    try:
        other = lower()
    except ModelError as exc:
        result.notes.append(f"a fresh copy at a {LOWER}x smaller learning rate failed: {exc.message}")
        return False
    if other is None:
        return False
    if isinstance(other, str):   # not tried, and why
        result.notes.append(f"the outputs collapsed in training: {other}")
        return False
    slower = d["lr"] / LOWER
    fits = other.reached_at is not None and not other.interrupted
    d["lower_lr"] = {"lr": slower, "passed": fits, "steps": other.step,
                     "final_loss": other.losses[-1] if other.losses else None}
    if other.interrupted:
        result.code, d["interrupted"] = int(other.interrupted), True
        result.notes.append(f"interrupted while a fresh copy trained at lr {slower:g}: the run's own numbers are complete")
        return False
    if not fits:
        result.notes.append(f"a fresh copy at lr {slower:g} did not memorise the batch either (final loss "
                            f"{_fmt(other.losses[-1]) if other.losses else '—'} in {other.step} step(s))")
        return False
    d["passed_at_lower_lr"] = True
    result.add("lr-too-large", "warning", "", f"at lr {d['lr']:g} training made every sample's output the same "
               f"(identical-outputs) and the batch was not memorised in {curve.step} step(s); a fresh copy at lr "
               f"{slower:g} memorised it in {other.reached_at} step(s): the step is too large for this model, not the "
               "model broken", hint=f"train it at lr {slower:g} or lower, or with a warm-up (post-LN transformers such "
                                     "as BERT want one)")
    result.verdict = (f"NOT AT THIS LR: the outputs collapsed at lr {d['lr']:g}; at lr {slower:g} the batch is "
                      f"memorised in {other.reached_at} step(s)")
    return True


def _header_and_data(result, trainer, curve, opts, ctx) -> None:
    losses = curve.losses
    optimizer = ctx.spec.optimizer
    lr = optimizer.learning_rate
    initial, final = (losses[0], losses[-1]) if losses else (None, None)
    finite = [v for v in losses if math.isfinite(v)]
    final_acc = curve.accs[-1] if curve.accs and final is not None and math.isfinite(final) else None
    custom = getattr(trainer.loss_fn, "custom", None) is not None   # its accuracy is told, not required (a review)
    target = f"loss ≤ {opts.target_ratio:g} × initial" + (" and batch accuracy 100%" if curve.accs and not custom else "")
    if curve.constant is not None and losses and curve.yardstick < losses[0]:
        target = target.replace(" × initial", f" × {CONSTANT_TIMES:g} × the loss of answering every sample with the made-up "
                                f"target's mean ({curve.constant:.4g}), lower than the initial: an output that starts "
                                "large falls far by shrinking alone")
    if opts.target_loss is not None and opts.target_loss < 0:   # trend.goal_of: a target below 0 judges alone
        target = f"loss ≤ {opts.target_loss:g} (a target below 0: the ratio to the initial loss does not judge)"
    elif opts.target_loss is not None:
        target += f", or loss ≤ {opts.target_loss:g}"
    # Header keys must not collide with data/series keys ("loss" is the per-step list in JSON).
    result.header.update({
        "loss_rule": trainer.loss_fn.describe(),
        "training": f"{describe_optimizer(optimizer)}, lr {lr:g}, at most {opts.budget} steps"
                    + (f" (extended to {curve.budget} while the loss still fell toward the target, at most "
                       f"{_cap(curve, opts)}{' for its fast steps' if _cap(curve, opts) > opts.cap else ''})"
                       if curve.budget > opts.budget else "") + ", train mode"
                    + _dropout_off(trainer) + ", on a copy"
                    + (f", autocast {trainer.amp}" if trainer.amp else ""),
        "target": target,
    })
    steps, seconds = curve.step, curve.seconds
    result.data.update({
        "passed": curve.reached_at is not None, "interrupted": bool(curve.interrupted), "steps": steps,
        "max_steps": opts.budget, "step_budget": curve.budget, "step_cap": _cap(curve, opts), "initial_loss": initial, "final_loss": final,
        "best_loss": min(finite) if finite else None, "steps_to_target": curve.reached_at,
        "target_ratio": opts.target_ratio, "target_loss": opts.target_loss, "final_accuracy": final_acc,
        "constant_loss": curve.constant,
        "optimizer": optimizer.name, "lr": lr,
        "momentum": optimizer.momentum if optimizer.name == "sgd" else None, "amp": trainer.amp or "none", "seed": ctx.seed,
        "seconds": round(seconds, 3), "steps_per_second": round(steps / seconds, 2) if seconds > 0 else None,
        "batch_size": trainer.samples, "trainable_tensors": len(trainer.trainable),
        "trainable_values": sum(p.numel() for _, p in trainer.trainable),
        "frozen_tensors": trainer.frozen, "dropout_off": trainer.dropped, "functional_dropout_off": trainer.functional,
        "functional_dropout_kept": trainer.functional_kept,
    })
    result.series["loss"] = losses
    result.series["grad_norm"] = curve.grad_norms
    result.series["learning_rate"] = curve.lrs
    if curve.accs:
        result.series["accuracy"] = curve.accs
    if trainer.scaler is not None:   # fp16: the GradScaler's scale each update used, and what it skipped
        result.series["loss_scale"] = curve.scales
        result.data["skipped_steps"] = sum(curve.skipped)
        result.data["skipped_at"] = [i for i, s in enumerate(curve.skipped) if s]


def _dropout_off(trainer) -> str:
    """" (dropout off: 3 modules, 12 functional calls a step)", or nothing."""
    parts = [f"{len(trainer.dropped)} module{'s' * (len(trainer.dropped) != 1)}"] if trainer.dropped else []
    if trainer.functional:
        parts.append(f"{trainer.functional} functional call{'s' * (trainer.functional != 1)} a step")
    said = f"dropout off: {', '.join(parts)}" if parts else ""
    if trainer.functional_kept:
        said += ("; " if said else "") + ("dropout drawn through torch's functions left on: a checkpointed function "
                                          "drew it again in backward")
    return f" ({said})" if said else ""


def _cap(curve, opts) -> int:
    """The most steps the run could take: --steps, the default cap, or a fast run's larger one (loop._cap)."""
    return max(opts.cap, curve.cap or 0)


def _summary(result, curve, opts) -> None:
    from ...fmt import sparkline

    d = result.data
    initial, final, steps, seconds = d["initial_loss"], d["final_loss"], curve.step, curve.seconds
    result.summary += [
        ("Initial loss", _fmt(initial)),
        ("Final loss", _fmt(final) + (f"  ({final / initial:.3g} × initial)" if initial and final is not None
                                      and initial > 0 and math.isfinite(final) else "")),
        ("Best loss", _fmt(d["best_loss"])),
    ]
    if d["final_accuracy"] is not None:
        result.summary.append(("Batch accuracy", f"{100 * d['final_accuracy']:.1f}%"))
    result.summary += [
        # "toward the target" was said of a loss falling toward a floor above it (a sweep: a dead-ReLU MLP's label
        # entropy, named in the same report); the projection decides, the floor is the verdict's to say
        ("Steps", f"{steps} of {curve.budget}" + (f" (extended from {opts.budget}: the loss was still falling there)"
                                                   if curve.budget > opts.budget else "")
         + (f" (target reached at step {curve.reached_at})" if d["passed"] else "")),
        ("Time", f"{seconds:.2f} s ({steps / seconds:.1f} steps/s)" if seconds > 0 else "—"),
        ("Loss curve", sparkline(_thin(curve.losses, 60)) or "—"),
    ]
    if "loss_scale" in result.series:
        from ...core.scaling import scale_summary

        result.summary.append(("Loss scale", scale_summary(curve.scales, curve.skipped)))


def _nonfinite_params(trainer) -> tuple[str, str]:
    """After a loss that went non-finite following an update: (what the steps did to the parameters,
    a hint), or ("", "") when every parameter is still finite (the forward is then the place to look).
    One read, on this failure path only."""
    import torch

    from ...core.rounding import adam_underflow, nonfinite_hint

    flags = torch.stack([p.detach().isfinite().all() for _, p in trainer.trainable]).tolist()
    bad = [(n, p) for (n, p), ok in zip(trainer.trainable, flags) if not ok]
    if not bad:
        return "", ""
    dtype = str(bad[0][1].dtype).replace("torch.", "")
    why = adam_underflow(trainer.optimizer, dtype)
    text = (f": the optimizer steps made {len(bad)} of {len(trainer.trainable)} trainable parameter tensor(s) "
            f"Inf/NaN ({_names([n for n, _ in bad], 6)})" + (f"; why: {why}" if why else ""))
    return text, (nonfinite_hint(trainer.ctx) if why else
                  "the update itself is non-finite: lower the learning rate (--lr) or clip the gradients")


def _rose(curve, initial, final) -> bool:
    """The loss ended more than ROSE_REL above its start, finite (a review: a gradient reversal left on the output
    path climbed 1.08 → 25.9, and with flat-loss gone no cause was said); after one step too (a review: `--steps 1`
    rose 138x, told "no mechanical cause found")."""
    return (curve.step >= 1 and curve.nonfinite_at is None and initial is not None and final is not None
            and math.isfinite(final) and initial > 0 and final > (1 + ROSE_REL) * initial)


def _never_moved(curve, initial: float) -> bool:
    """No step's loss rose above the initial one by more than ROSE_REL: a loss that rose 4.9x on the first steps and
    stuck there (a softmax Adam saturated into a clamp) was "flat from the start", and that second cause kept the
    run from being tried at a lower rate (a sweep, so_48594888's correct version). A noisy flat loss stays flat."""
    return all(v - initial <= ROSE_REL * abs(initial) for v in curve.losses if math.isfinite(v))


def _cause_findings(result, trainer, curve, causes, opts) -> int:
    """Findings that explain a failure (cannot-overfit decides; the causes gradflow and doctor call errors,
    non-finite-loss and no-grad, are errors here too); returns how many causes were found."""
    limit, steps, n_trainable = opts.max_names, curve.step, len(trainer.trainable)
    initial, best, final = result.data["initial_loss"], result.data["best_loss"], result.data["final_loss"]
    found = 0
    if curve.nonfinite_at is not None:
        found += 1
        stepped = _nonfinite_params(trainer) if curve.nonfinite_at else ("", "")
        # an error, as in gradflow and doctor: the cause, listed before its consequence (cannot-overfit)
        result.add("non-finite-loss", "error", "", f"the loss became {final} at step {curve.nonfinite_at}"
                   + (" (the very first forward)" if curve.nonfinite_at == 0 else "") + stepped[0],
                   hint=stepped[1] or "run `torchdiag nancheck` on this model to find the first module with a non-finite value")
    if curve.no_graph or curve.missing:
        _no_grad(result, trainer, curve, limit)
        found += bool(curve.no_graph or curve.no_grad)   # parameters the inputs never reached are no cause
    zero = causes.zero
    if zero and not (trainer.group is not None or trainer.sharded):   # (no extra pass outside a wrapper's collectives)
        zero = _routed(result, trainer, zero, zeros=True)
    if zero and curve.nonfinite_at is not None:   # the run ended before a zero-initialised gate could open (a
        result.notes.append(                       # sweep: timm resnet18's zero-init blocks under float16 Adam)
            f"{len(zero)} parameter tensor(s) had a gradient of exactly zero until the loss became non-finite at step "
            f"{curve.nonfinite_at}: too few steps to tell a zero-initialised gate from a dead path ({_names(zero, limit)})")
    elif zero:
        found += 1
        result.add("zero-grad", "warning", zero[0],
                   f"{len(zero)} parameter tensor(s) had a gradient of exactly zero at every step: "
                   f"{_names(zero, limit)}", hint="dead activations or a saturated path upstream; run `torchdiag gradflow`")
    routed = set(causes.zero) - set(zero)   # said as routed-by-input: never stepped, by the batch's routing
    unchanged = [n for n in causes.unchanged if n not in set(curve.missing) and n not in routed]   # (no-grad said it)
    unchanged = _not_invariant(result, trainer, unchanged)
    if unchanged:
        found += 1
        result.add("unchanged-params", "warning", unchanged[0],
                   f"{len(unchanged)} of {n_trainable} trainable parameter tensor(s) never changed in {steps} "
                   f"step(s): {_names(unchanged, limit)}")
    if steps >= 2 and initial is not None and best is not None and initial != 0 and \
            (initial - best) <= FLAT_REL * abs(initial) and curve.nonfinite_at is None and _never_moved(curve, initial):
        found += 1
        result.add("flat-loss", "warning", "", f"the loss is flat from the start: best {best:.6g} vs initial {initial:.6g} "
                   f"over {steps} steps", hint="gradients vanish or the output ignores the parameters; try `torchdiag gradflow`"
                   + _trained_start(trainer.ctx, initial, trainer.opts))
    if _rose(curve, initial, final):
        found += 1
        result.add("loss-rose", "warning", "", f"the loss rose from {_fmt(initial)} to {_fmt(final)} (at most "
                   f"{_fmt(max(v for v in curve.losses if math.isfinite(v)))}) and ended above its start: the steps "
                   "make it worse", hint=f"a learning rate too large for this model ({trainer.ctx.option('lr')}, now "
                                        f"{result.data['lr']:g}), or a gradient "
                   "of the wrong sign on the loss path (a gradient reversal, an objective maximised by mistake): "
                   "`torchdiag gradflow` on it")
    if causes.final_same:
        found += 1
        _identical_outputs(result, curve, causes)
    still = set(causes.unchanged) | set(curve.missing) | set(causes.zero)
    if causes.bounded and len(still) < n_trainable:   # nothing trained: the output's range says nothing of a squash
        found += 1
        _bounded_output(result, causes.bounded, trainer.ctx)
    elif causes.scaled and len(still) < n_trainable:   # a custom loss: what its value does when the output is scaled
        found += 1
        k, lower, here = causes.scaled
        result.add("bounded-output", "warning", "", f"scaling the trained output by {k:g} lowers the loss from "
                   f"{_fmt(here)} to {_fmt(lower)}: the output's range holds the loss back (a softmax, sigmoid or tanh "
                   "at the end, or a small output scale?)", hint="give the loss the raw scores (logits) it expects")
    if causes.stranded:
        found += 1
        _stranded(result, causes.stranded, trainer.ctx)
    return found + _precision_findings(result, trainer, curve, causes)


def _stranded(result, s: dict, ctx) -> None:
    k, n = len(s["samples"]), s["batch"]
    shown = ", ".join(map(str, s["samples"][:8])) + (" …" if k > 8 else "")
    result.add("stranded-samples", "warning", s["module"],
               f"{k} of {n} samples ({shown}) get no unit of {s['module']} ({s['type']}): every output of it is 0 for "
               f"them in the trained copy, so no weight before it changes their output, and they all get one output while "
               f"their targets differ; they carry {s['share']:.0%} "
               f"of the final loss ({_fmt(s['stranded_loss'])} a sample, the others {_fmt(s['rest_loss'])})",
               hint=f"a unit of {s['module']} must be alive for them: a smaller {ctx.option('lr')} (a step too large "
                    f"can push units off for good; now {result.data['lr']:g}), another seed or initialisation, a wider "
                    "layer there, or an activation with a gradient below zero (LeakyReLU)")


def _no_grad(result, trainer, curve, limit: int) -> None:
    """no-grad: the same error as doctor's and gradflow's (core/unreached.py), a cause of cannot-overfit."""
    from ...core.unreached import (
        NO_GRAD,
        NO_GRAD_HINT,
        NO_GRAD_SEVERITY,
        NOT_REACHED,
        NOT_REACHED_HINT,
        by_top_module,
        no_grad_message,
        not_reached,
        not_reached_message,
        top_module,
    )

    if curve.no_graph:
        result.add(NO_GRAD, NO_GRAD_SEVERITY, "", "the loss does not require grad: no trainable parameter is connected "
                   "to it (forward under torch.no_grad(), detach(), or outputs built from non-trainable tensors)",
                   hint="run `torchdiag gradflow` on this model")
        return
    missing = curve.missing
    wrapped = trainer.group is not None or trainer.sharded    # a DDP/FSDP copy: no extra pass outside its collectives
    quiet = [] if wrapped else not_reached(trainer.work, trainer.batch, missing, trainer.ctx)
    for group in by_top_module(quiet, trainer.work):   # modules the default inputs never ran (core/unreached.py)
        result.add(NOT_REACHED, "info", top_module(group, trainer.work), not_reached_message(group, trainer.batch),
                   hint=NOT_REACHED_HINT)
    missing = [n for n in missing if n not in set(quiet)]
    if missing and not wrapped:
        missing = _routed(result, trainer, missing)
    curve.no_grad = missing
    if missing:
        result.add(NO_GRAD, NO_GRAD_SEVERITY, top_module(missing, trainer.work),
                   no_grad_message(missing, len(trainer.trainable), limit), hint=NO_GRAD_HINT)


def _not_invariant(result, trainer, names: list[str]) -> list[str]:
    """Of `names` (never changed), those the loss depends on: the rest are invariant by design, info (core/invariance:
    a bias a following softmax or batch-statistics normalisation cancels, asked as doctor and gradflow ask it, on a
    float64 copy as the run started, dropout off as in the run). A sweep: efficientformerv2_s0's talking-head bias, a
    constant added to every logit of a softmax's row, stayed bit-identical for 52 steps while the batch was
    memorised, a warning here and info in doctor. Not asked under torchrun (no extra pass outside its collectives)."""
    import torch

    from ...core import invariance
    from ...core.design import dropout_off
    from ...core.device import has_float64
    from ...errors import ModelError

    ctx = trainer.ctx
    if not names or not has_float64(ctx.device) or ctx.wrapper is not None or trainer.sharded:
        return names
    try:
        copy = ctx.train_copy(trainer.work, "to re-check parameters that never changed", torch.float64,
                              backward=True).double()
        with torch.no_grad():
            for n, p in copy.named_parameters():
                if n in trainer.start and trainer.start[n].shape == p.shape:
                    p.copy_(trainer.start[n])
        copy.train(trainer.work.training)
        dropout_off(copy)
        found = invariance.cancelled(copy, trainer.batch.map(invariance.double), names, ctx.loss(), ctx)
    except ModelError as exc:   # no room for a copy, or its forward failed: the verdicts stand
        result.notes.append(f"parameters that never changed not re-checked for invariance: {exc.message}")
        return names
    if found:
        shown = sorted(found)
        result.add("invariant", "info", shown[0] if len(shown) == 1 else "",
                   f"{len(shown)} parameter(s) never changed by design: the loss does not depend on them (shifting "
                   f"them by random values on a float64 copy leaves it unchanged within 1e-9 of itself, as when a "
                   f"following normalisation or softmax cancels them): {_names(shown, trainer.opts.max_names)}")
    return [n for n in names if n not in found]


def _routed(result, trainer, missing: list[str], zeros: bool = False) -> list[str]:
    """Of `missing` (no gradient at step 0; `zeros`: a gradient of exactly zero at every step), those fresh inputs of
    the batch's kind reach (with a gradient not all zeros) on a copy of the model as it started
    (core/unreached.reached_by_other_inputs: an MoE expert a small batch picked none of, in a dense mixture multiplied
    by a routing weight of 0) are routed-by-input, info, as in gradflow and doctor; the rest stay as they were."""
    from ...core import repeats
    from ...core.unreached import (
        ROUTED_HINT,
        reached_by_other_inputs,
        routed_message,
    )
    from ...errors import ModelError

    ctx = trainer.ctx
    try:
        start = trainer.source if trainer.source is not None else trainer.work
        work = ctx.train_copy(start, "to re-check parameters without a gradient on fresh "
                              "inputs", backward=True)
        asked = _selected(work, trainer.batch, missing, ctx) if zeros else missing
        ran = {n for n, _ in trainer.trainable if n not in set(missing)}
        fresh = reached_by_other_inputs(work, trainer.batch, asked, ctx, ran, nonzero=zeros,
                                        saturated=[n for n in missing if n not in asked])
    except ModelError as exc:   # no room for a copy, or its forward failed: the verdicts stand
        result.notes.append(f"parameters without a gradient not re-checked on fresh inputs: {exc.message}")
        return missing
    if fresh.said():
        result.notes.append(f"parameters without a (non-zero) gradient re-checked on fresh inputs: {fresh.said()}")
    if fresh.reached:
        result.add("routed-by-input", "info", repeats.common_path(sorted(fresh.reached)) or "(root)",
                   routed_message(sorted(fresh.reached), fresh.runs, zeros), hint=ROUTED_HINT)
    return [n for n in missing if n not in fresh.reached]


def _selected(work, batch, names: list[str], ctx) -> list[str]:
    """Of `names` (a gradient of exactly zero), those stopped by a choice among parts an input can change
    (core/stops Stop.selects: a routing weight of 0, a mask), found on `work` (one forward and backward); a
    saturation (a one-hot softmax, dead units) is not asked whether fresh inputs reach it."""
    from ...core.stops import stops

    try:
        found = stops(work, batch, names, ctx, ctx.loss())
    except Exception:   # an explanation only: unexplained, nothing is asked and the warnings stand
        return []
    work.zero_grad(set_to_none=True)
    return [n for n in names if n in found and found[n].selects()]


def _precision_findings(result, trainer, curve, causes) -> int:
    """fp16 loss scaling that skipped every update (error); reduced-precision weights whose update
    rounds away (warning). Returns how many were found."""
    from ...core.rounding import CODE, hint, message

    found, amp = 0, trainer.ctx.option("amp")
    if curve.skipped and all(curve.skipped) and not curve.interrupted:
        found += 1
        where, how = causes.skip_culprit or ("", "")
        at = f"; the first non-finite gradient appears at {where}: {how}" if where else ""
        result.add("every-step-skipped", "error", where,
                   f"the GradScaler skipped all {len(curve.skipped)} update(s): every step had inf/NaN gradients "
                   f"(scale {curve.scales[0]:g} → {curve.scales[-1]:g}){at}",
                   hint=f"the gradients overflow float16 in backward even at loss scale {curve.scales[-1]:g}: keep that "
                        f"module in float32 (autocast(enabled=False)) or use {amp} bf16; `torchdiag nancheck {amp} fp16` "
                        "shows the values")
    if causes.rounding:
        decides = _rounding_decides(trainer, causes)
        found += decides
        if not decides:
            stuck = sum(r["unchanged"] for r in causes.rounding)
            total = causes.moving or sum(p.numel() for _, p in trainer.trainable)
            result.notes.append(f"the updates that round away ({CODE}) are {stuck:,} of the {total:,} elements with a "
                                "non-zero gradient: too few to stop the fall alone, so they are no cause of a failure")
        optimizer = trainer.ctx.spec.optimizer
        result.add(CODE, "warning", causes.rounding[0]["name"],
                   message(causes.rounding, optimizer.learning_rate,
                           f"the first {describe_optimizer(optimizer)} step" if not causes.rounded_at else
                           f"{describe_optimizer(optimizer)} step {causes.rounded_at + 1}"),
                   hint=hint(trainer.ctx))
        result.data["rounded_away"] = causes.rounding
    return found


def _rounding_decides(trainer, causes) -> bool:
    """Updates that round away are a cause only where they can stop the whole fall: in a small share of the
    trainable elements (norm gains: a sweep's bfloat16 LLaMA reached its target at step 192 of a --steps 100 run
    called cannot-overfit) they leave the rest training."""
    if not causes.rounding:
        return False
    stuck = sum(r["unchanged"] for r in causes.rounding)
    return stuck >= MINOR_SHARE * (causes.moving or sum(p.numel() for _, p in trainer.trainable))


HELD = 0.9   # of a float32 copy's fall (its log), the share a run whose updates round away must reach to be unhindered


def _rounding_held(result, curve, wide) -> bool:
    """Did the updates that round away hold this failed run back? A float32 copy trained for as many steps (`wide`)
    answers: where the run fell at least HELD of the copy's fall (on a log scale), they did not, in these steps (a
    sweep: a float16 LLaMA under SGD, 36% of its elements rounding away, fell to 0.675x in 60 steps as float32 did),
    and the verdict is the fall's; where the copy fell further, they did. True (held) without a copy to ask."""
    from ...errors import ModelError

    d = result.data
    initial, final = d["initial_loss"], d["final_loss"]
    if d["passed"] or wide is None or curve.nonfinite_at is not None or curve.interrupted or \
            not (initial and final and initial > 0 and final > 0):
        return True
    try:
        other = wide(curve.step)
    except ModelError as exc:
        result.notes.append(f"a float32 copy to compare the rounding against was not trained: {exc.message}")
        return True
    if other is None or other.interrupted or len(other.losses) < 2 or not all(
            math.isfinite(v) and v > 0 for v in (other.losses[0], other.losses[-1])):
        return True
    ratio = other.losses[-1] / other.losses[0]
    held = ratio < 1 and math.log(final / initial) > HELD * math.log(ratio)
    d["float32_copy"] = {"steps": other.step, "ratio": ratio, "held": held}
    said = f"a float32 copy trained the same way fell to {ratio:.3g}× its start in {other.step} step(s), this run to " \
           f"{final / initial:.3g}×"
    result.notes.append(f"{said}: the updates that round away held it back" if held else
                        f"{said}: the updates that round away have not held the fall back in these steps, so they are "
                        "no cause of this failure yet; they may stop it later (more steps show it, or float32 master "
                        "weights avoid it)")
    return held


def _identical_outputs(result, curve, causes) -> None:
    where, what, collapse = "", "every sample of the batch gets the same output", causes.collapse
    if causes.near_same is not None:   # the same to within a small share (a collapse short of exact)
        what = (f"every sample of the batch gets the same answer: the probabilities it gives the batch's labels are "
                f"alike across samples (within {causes.near_same:.2g})")
    if collapse and collapse.get("module"):
        where = collapse["module"] if collapse["module"] != "(root)" else ""
        what += (f"; {collapse['module']} ({collapse['type']}) is the first module whose inputs differ across "
                 "samples but whose output does not")
    elif collapse and collapse.get("inputs_identical"):
        what += "; the inputs themselves are identical across samples"
    if curve.first_same:
        what += " (already before training)"
    if causes.bounded is not None:   # the range's floor is the cause (a sweep: a tanh output read by cross-entropy
        # over 768 classes levels 0.008 above it as one answer for all; the label entropy, 0.69, was quoted)
        what += (f"; the output's range keeps the loss above {causes.bounded['floor']:.4g} whatever it answers "
                 "(bounded-output), which leaves little to gain from telling the samples apart")
    elif causes.floor is not None:
        what += f"; a batch-constant prediction cannot go below the label entropy {causes.floor:.4g}"
    result.add("identical-outputs", "warning", where, what,
               hint="look for a mean, pooling or normalisation over the batch dimension (dim 0), "
               "or a layer that maps every input to the same value (dead ReLU, saturation)")


def _bounded_output(result, bounded: dict, ctx) -> None:
    lo, hi = bounded["box"]
    loss, batch = ctx.option("loss"), ctx.option("batch")
    kept = ("every output row has norm 1 (an L2 normalisation at the end?)" if bounded.get("sphere") else
            f"every output value stays within [{lo:g}, {hi:g}] (a {'sigmoid or softmax' if lo == 0 else 'tanh'} "
            "at the end?)")
    result.add("bounded-output", "warning", "",
               f"{kept}: with {bounded['classes']} classes cross-entropy cannot go below "
               f"{bounded['floor']:.4g}, and the target needs {bounded['needed']:.4g}",
               hint="cross-entropy expects unbounded logits: drop the final squashing (the loss applies "
                    f"log-softmax itself), or pick a loss that fits the output ({loss} mse, {loss} PATH:fn, {batch})")


def _verdict(result, trainer, curve, opts, ctx, found: int, second=None, few=None, own_floor: bool = False,
             out_of_range: dict | None = None, term_floors: list | None = None, held=None,
             batch_floor=None, nonneg: str | None = None) -> None:
    d, steps, losses = result.data, curve.step, curve.losses
    initial, final, final_acc = d["initial_loss"], d["final_loss"], d["final_accuracy"]
    trend = None
    if not d["passed"] and not found and nonneg == "made":
        result.notes.append(f"{NONNEG_SAID} (judge it against its real targets: {ctx.option('batch')}, or a "
                            f"{ctx.option('loss')} PATH:fn)")
    elif not d["passed"] and not found and nonneg == "real":
        result.notes.append(NONNEG_REAL)
    if not d["passed"] and not found and curve.nonfinite_at is None and (
            _within_range(result, curve, opts, out_of_range) or _at_batch_floor(result, curve, opts, batch_floor)):
        return
    if not d["passed"] and not found and curve.nonfinite_at is None:
        memorised = _at_term_floors(result, trainer, curve, opts, term_floors) or \
            _first_memorised(result, trainer, curve, opts)
        if memorised is True:
            return
        found += memorised is False
    yard = curve.yardstick if losses else initial   # the initial loss, or the made-up target's constant fit when lower
    if not d["passed"] and curve.nonfinite_at is None and not curve.peer_stop and initial is not None:
        goal = _reachable_goal(goal_of(yard, opts), initial, opts, out_of_range, curve)
        trend = judge(losses, goal)
        d["trend"] = {"kind": trend.kind, "steps_to_go": trend.to_go, "floor": trend.floor}
        if trend.kind == "short" and not found and _too_short(result, curve, opts, ctx):
            return
        # no plateau, no cause: not a failure yet. With a cause found, a fall projected to the target within as many
        # steps again has not been stopped by it (a sweep: bfloat16 Mistral, five RMSNorm weights whose updates round
        # away, 0.0107 x initial at step 100, the target at step 108 with --steps 150)
        # (a slowing fall the linear projection alone carries to the target is no evidence against the cause, nor a
        # loss still far from it: a review's noisy-target head, 5.8x the target, was "10 steps away" from a floor at
        # 4x it; the run must be within NEAR_GOAL of the target)
        close = final is not None and final <= NEAR_GOAL * goal
        if trend.falling and trend.to_go is not None and (
                not found or (trend.to_go <= steps and not trend.slowing and close)):
            if found:
                causes = ", ".join(sorted({f.code for f in result.findings if f.severity != "info"}))
                result.notes.append(f"the cause found above ({causes}) has not stopped the loss: it is falling toward "
                                    f"the target, about {trend.to_go} step(s) away")
            _not_yet(result, curve, opts, ctx, trend, second)
            return
        if trend.kind == "levelling" and not found and not curve.levelled and _unsure_floor(trend, final, yard, opts):
            _not_yet(result, curve, opts, ctx, trend, second)
            return
        _trend_note(result, trend)
    if not d["passed"] and not found and nonneg == "made" and curve.nonfinite_at is None and \
            _features_not_logits(result, curve, opts, ctx):   # (after the trend: a fall still on its way is not-yet)
        return
    settled = trend is not None and trend.kind in ("plateau", "levelling")
    if settled and final_acc == 1.0 and own_floor and not found and initial and initial > 0:
        _at_its_floor(result, d, opts, ctx)
        return
    if not d["passed"] and curve.nonfinite_at is None and steps >= 20 and final is not None and not settled:
        tail = losses[int(0.9 * steps)]
        if final < 0.999 * tail:
            # with a cause found (a sweep: bfloat16 updates that round away) the error stands on it, not on the fall
            then = (f"; the cause found above ({', '.join(sorted({f.code for f in result.findings if f.severity != 'info'}))})"
                    " may stop it before the target: it is why this is an error, not not-overfit-yet") if found else \
                (f": more {ctx.option('steps')} or a larger {ctx.option('lr')} may reach the target")
            result.notes.append(f"the loss was still falling at the end ({100 * (final / tail - 1):.1f}% over the last "
                                f"10% of steps){then}")
    if d["passed"] and curve.no_grad:   # memorised without them: still the no-grad error (not-reached ones are info)
        result.verdict = (f"FAIL: {len(curve.no_grad)} trainable parameter tensor(s) get no gradient (the batch was "
                          f"memorised without them: loss {_fmt(initial)} → {_fmt(final)} in {curve.reached_at} step(s))")
        return
    if d["passed"]:
        result.verdict = (f"PASS: loss {_fmt(initial)} → {_fmt(final)} in {curve.reached_at} step(s)"
                          + (f", batch accuracy {100 * final_acc:.0f}%" if final_acc is not None else ""))
        return
    bits = [f"final loss {_fmt(final)}"]
    if opts.target_loss is not None and opts.target_loss < 0:
        bits.append(f"target {opts.target_loss:g}")
    elif initial is not None and initial > 0 and final is not None and math.isfinite(final):
        bits.append(f"{final / initial:.3g} × initial (target {opts.target_ratio:g})" if yard == initial else
                    f"{final / yard:.3g} × {_fmt(yard)}, {CONSTANT_TIMES:g} × the loss of answering every sample with the "
                    f"made-up target's mean, below the initial {_fmt(initial)} (target {opts.target_ratio:g} × that)")
    if final_acc is not None and final_acc < 1:
        bits.append(f"batch accuracy {100 * final_acc:.1f}%")
    hint = None if found else (f"no mechanical cause found: try more {ctx.option('steps')} (now {curve.step}) "
                               f"or another {ctx.option('lr')} (now {d['lr']:g})" + _frozen_words(trainer)
                               + _trained_start(ctx, initial, opts))
    if hint and nonneg == "real":
        hint = ("drop the activation after the last layer: cross-entropy takes raw logits (it applies log-softmax "
                f"itself), and an output held at 0 gets no gradient; or try more {ctx.option('steps')} (now {curve.step})")
    if hint and out_of_range and out_of_range.get("floor") and not curve.first_terms and initial is not None \
            and final is not None and initial - final >= FLOOR_WAY * (initial - out_of_range["floor"]):
        # most of the way to the floor only: a loss stuck far above it has another cause (a review: a final ReLU
        # whose dead outputs held the loss at 0.81 against a floor of 0.49)
        # the note above gives the floor the output's range leaves: not "no cause" (a sweep: timm resnet10t with
        # global_pool='', its ReLU map against a normal target, 89% of the way to that floor)
        hint = (f"the random target torchdiag drew lies partly outside what the output reaches "
                f"({out_of_range['kind']}; floor {_fmt(out_of_range['floor'])}, see the note): judge it against its "
                f"real targets ({ctx.option('batch')}, or a {ctx.option('loss')} PATH:fn), or try more "
                f"{ctx.option('steps')} (now {curve.step})")
    other, fits = _second_opinion(result, second)
    if fits:
        _optimizer_fails(result, ctx, other, steps)
        hint = None
    small = None
    if not fits and not found and (other is None or not other.interrupted):
        done = steps + (other.step + 1 if other is not None else 0)   # the progress shown so far
        small = _beyond_capacity(result, trainer, few, bits, done)
        if small == "held":
            return
        if not small and curve.drew:
            small = _noise_floor(result, trainer, held, bits, done)
            if small == "held":
                return
            if small == "unlearned" and hint:
                hint += (f"; the forward draws random numbers at every pass and the loss fell only to "
                         f"{curve.losses[-1] / curve.losses[0]:.2g} × its start: a draw where the data or a weight "
                         "belongs (torch.randn_like(x) for x + noise, a random weight or permutation in forward) "
                         "keeps it there")
    result.add("cannot-overfit", "error", "", f"could not memorise one batch of {trainer.samples} in "
               f"{steps} step(s): " + ", ".join(bits), hint=hint)
    result.verdict = f"FAIL: cannot overfit one batch ({', '.join(bits)})" + (
        f"; {OPTIMIZER.describe()} memorises it in {other.reached_at} step(s)" if fits else "")
    if other is not None and other.interrupted:
        result.verdict = f"INTERRUPTED in the second opinion; the run itself: {result.verdict}"
    elif small == "interrupted":
        result.verdict = f"INTERRUPTED in the two-sample run; the run itself: {result.verdict}"
    elif small == "interrupted-held":
        result.verdict = f"INTERRUPTED in the run with its draws held fixed; the run itself: {result.verdict}"


def _trained_start(ctx, initial, opts) -> str:
    """A run from --checkpoint starts trained: its target, a share of that low start, can lie below the floor the batch
    allows (a new user's GPT: two sequences with one first token and different second ones, 0.0169 x a start of 0.65
    against 0.01, every other position at 1e-4)."""
    if not getattr(ctx.spec, "checkpoint", None) or initial is None or opts.target_loss is not None:
        return ""
    return (f"; the run started from {ctx.option('checkpoint')} at a loss of {_fmt(initial)}, already trained: "
            f"{opts.target_ratio:g} × that can lie below what this batch allows (the same input with different "
            f"targets); a larger {ctx.option('target_ratio')} or a run without the checkpoint tells")


def _first_memorised(result, trainer, curve, opts) -> bool | None:
    """auto over several outputs: the first output's own term reached the target (and its batch accuracy 100%) while
    the sum did not, with no cause found. The other outputs' random targets are torchdiag's, and some cannot be reached
    by any training (a sweep: a domain branch behind a gradient reversal, an output that repeats one tensor twice):
    the batch is memorised on the first output, the others' terms said as info. An other output the same for every
    sample of the batch (a review: a head that averages over the batch) is a fault, not a target out of reach."""
    first, last = curve.first_terms, curve.last_terms
    if not first or not last or opts.target_loss is not None or result.data["final_accuracy"] not in (None, 1.0) \
            or trainer.sharded:
        return None
    import torch

    now = torch.stack([v.float().reshape(()) for _, v in last]).tolist()
    (label, start), end = first[0], now[0]
    if not (start > 0 and math.isfinite(end) and 0 <= end <= opts.target_ratio * start):
        return None
    same = _same_rows(trainer, [k for k, _ in first[1:]])
    if same:   # False: a cause found
        result.add("identical-outputs", "warning", same[0], f"{label} memorised the batch, but {', '.join(same)} is the "
                   "same for every sample of it after training: it cannot tell them apart",
                   hint="look for an operation across the batch dimension (a mean or sum over dim 0, a view that mixes "
                        "samples) on its path")
        return False
    others = ", ".join(f"{k} {_fmt(a)} → {_fmt(b)}" for (k, a), b in zip(first[1:], now[1:]))
    result.data.update(passed=True, memorised_on=label)
    result.add("other-outputs-unfitted", "info", "", f"the batch is memorised on {label} ({_fmt(start)} → {_fmt(end)}, "
               f"{end / start:.3g} × its start); the other outputs' terms, against targets torchdiag drew at random, "
               f"did not follow ({others}): a random target an output cannot reach (a bounded range, copies of one "
               "tensor, a branch behind a gradient reversal) keeps the sum above the target",
               hint="judge them with a --loss PATH:fn of your own, or a --batch with their real targets")
    result.verdict = f"PASS: the batch is memorised on {label} ({_fmt(start)} → {_fmt(end)} in {curve.step} step(s))"
    return True


KEPT = 10   # × the goal: how far above its floor a term may end after every term was at its floor at one step


def _at_term_floors(result, trainer, curve, opts, floors: list | None) -> bool:
    """auto over several outputs, the first keeping to a range (causes.term_floors): at some step, each term was at its
    own output's floor against its own made-up target (0 for an output of no range), within the target ratio of its
    fall to it, and at the last step still within KEPT times that. A sweep: DPT (a LayerNorm's rows beside a tanh
    pooler) was a false cannot-overfit; its pooler ends 0.04% of its fall above its floor. Reviews: a floor summed
    over the terms let a head stuck at one prediction hide in the sum; the first's floor alone let a frozen or
    bias-only second head pass; a tenth of the fall for the others let a 7-wide bottleneck under 8 channels, and a
    sigmoid head with one position in 12 stuck, pass. Any step (a sweep: CANINE at --steps 300 had both terms there at
    step 281, then Adam's oscillation left the last step 1.2% of the way above the first's floor), if the last keeps
    it (a review: a box output scaled by 0.3 after it was fitted, a head given noise, passed at the earlier step)."""
    first = curve.first_terms
    if not floors or not first or not curve.term_steps or opts.target_loss is not None or curve.reached_at is not None \
            or trainer.sharded:
        return False
    import torch

    labels = tuple(k for k, _ in first)
    # a step whose loss left an output out (no gradient path for a step: a review's crash) has no row of the others
    kept = [(step, t) for step, k, t in curve.term_steps if k == labels]
    if not kept or kept[-1][0] != len(curve.losses) - 1:   # the last step's own terms, or no verdict here
        return False
    values = torch.stack([t for _, t in kept]).tolist()   # the one read of every step's terms
    rows = []
    for (label, start), end, found in zip(first, values[-1], floors):
        floor = floor_of(found, start)
        if not (start > 0 and math.isfinite(end) and 0 <= end):
            return False
        rows.append({"output": label, "start": start, "end": end, "floor": floor,
                     "range": found["kind"] if floor else None, "fitted": bool(floor and found.get("fitted"))})

    def within(terms, slack: float) -> bool:
        return terms_within(terms, [r["start"] for r in rows], [r["floor"] for r in rows], opts.target_ratio, slack)

    at = next((k for k, terms in enumerate(values) if within(terms, 1.0)), None)
    result.data.update(terms=rows)
    way = "; ".join(f"{r['output']} {_fmt(r['start'])} → {_fmt(r['end'])}, "
                    f"{100 * (r['start'] - r['end']) / (r['start'] - r['floor']):.1f}% of the way to {_fmt(r['floor'])}"
                    for r in rows)
    if at is None or not within(values[-1], KEPT) or not rows[0]["floor"]:
        result.notes.append(f"each output against its own floor (0 where it keeps to no range): {way} (each must go "
                            f"{100 * (1 - opts.target_ratio):g}% at one step, and keep {max(0.0, 100 * (1 - KEPT * opts.target_ratio)):g}%)"
                            + (f"; every term was at its floor at step {kept[at][0]}: what the run reached there it "
                               "lost by the last step" if at is not None else ""))
        return False
    step = kept[at][0]
    for r, v in zip(rows, values[at]):
        r["end"], r["at"] = v, step
    result.data.update(passed=True, steps_to_target=step)
    said = "; ".join(f"{r['output']} {_fmt(r['start'])} → {_fmt(r['end'])}" + (
        f" (its floor {_fmt(r['floor'])}: {r['range']}{', fitted' if r['fitted'] else ''})" if r["range"] else "")
        for r in rows)
    beyond = "; ".join(sorted({real_beyond(r["range"]) for r in rows if r["range"]})) or real_beyond("")
    result.add("made-target-out-of-range", "info", "", f"each output's term reached the random target torchdiag drew "
               f"(normal, mean 0, std 1), or, where the output keeps to a range the target lies partly outside, "
               f"that range's floor, at step {step}: {said}. The batch is memorised as far as the outputs' ranges allow. "
               f"If the real targets go beyond a range ({beyond}), the output cannot fit them: that is a bug",
               hint="judge it against its real targets: --batch with them, or a --loss PATH:fn of your own")
    result.verdict = (f"PASS: the batch is memorised as far as each output's range allows (loss {_fmt(curve.losses[0])}"
                      f" → {_fmt(curve.losses[step])} at step {step} of {len(curve.losses) - 1})")
    return True


def _at_batch_floor(result, curve, opts, floor_of) -> bool:
    """The loss is within the target ratio of its fall to the floor the batch itself allows (ambiguity.py: positions
    with the same input and answer from the first step to the last and different targets): memorised as far as the
    batch allows; info, PASS. `floor_of`: () -> that floor (read here only)."""
    d = result.data
    final, yard = d["final_loss"], curve.yardstick if curve.losses else None
    if floor_of is None or yard is None or final is None or opts.target_loss is not None:
        return False
    floor = floor_of()
    if not 0 < floor < yard:
        return False
    if final - floor > opts.target_ratio * (yard - floor):
        result.notes.append(f"positions with the same answer and different targets leave the loss a floor of "
                            f"{_fmt(floor)}; the loss went {100 * (yard - final) / (yard - floor):.0f}% of the way "
                            "there")
        return False
    d.update(passed=True, floor=floor)
    prefix = getattr(curve.first_answers, "by_prefix", False)
    same = ("the same tokens up to them (the model is causal: each position reads only its prefix)" if prefix else
            "the same input")
    result.add("batch-floor", "info", "", f"some positions of the batch read {same} and get the same answer from the "
               f"model from the first step to the last while their targets differ: no weights "
               f"take the loss below {_fmt(floor)}, their targets' entropy; the loss reached {_fmt(final)}, the batch "
               "memorised as far as it allows",
               hint="a batch of distinct inputs (or contexts) judges it without this floor")
    result.verdict = (f"PASS: the batch is memorised as far as it allows: loss {_fmt(d['initial_loss'])} → "
                      f"{_fmt(final)}, its floor {_fmt(floor)}")
    return True


NONNEG_SAID = ("every output value is ≥ 0, at the start and the end (features after a ReLU or a pooling of them, not "
               "logits: a backbone without its head, or an activation after a classifier's last layer): cross-entropy "
               "against the classes torchdiag drew can only raise the target's value, never push the others below 0, "
               "so the loss falls slowly")
NONNEG_REAL = ("every output value is ≥ 0, at the start and the end: as logits, cross-entropy can only raise the "
               "target class's value, never push the others below 0, and an output held at 0 gets no gradient (an "
               "activation after the classifier's last layer?)")
FLOOR_WAY = 0.5    # of the way from the start to the floor a made-up target's range leaves: its hint names that floor
NONNEG_FALL = 0.1   # of its start: how far a cross-entropy over an output >= 0 must fall, every sample right, to be
                   # told the made-up classes are what holds it up


def _too_short(result, curve, opts, ctx) -> bool:
    """A budget under MIN_STEPS steps carries no trend: a loss still falling at its end is not-overfit-yet (a
    warning), not cannot-overfit (a sweep: check's `overfit-batch = {steps = 10}` failed a healthy MLP at 0.05x its
    start, every answer right, that memorises the batch at step 12)."""
    d, losses = result.data, curve.losses
    if len(losses) < 2 or not all(math.isfinite(v) for v in losses) or not losses[-1] < min(losses[:-1]):
        return False
    result.add("not-overfit-yet", "warning", "", f"the loss was still falling when the budget of {curve.step} step(s) "
               f"ended: {_fmt(d['initial_loss'])} → {_fmt(d['final_loss'])}; fewer than {MIN_STEPS} steps carry no "
               "trend to judge", hint=f"train longer: {ctx.option('steps')} {max(MIN_STEPS, opts.budget)} or more")
    target = f"target {opts.target_loss:g}" if opts.target_loss is not None else f"target {opts.target_ratio:g} × initial"
    result.verdict = (f"NOT YET: loss {_fmt(d['initial_loss'])} → {_fmt(d['final_loss'])} in {curve.step} step(s), "
                      f"still falling; too few steps to judge ({target})")
    return True


def _reachable_goal(goal: float, initial, opts, out_of_range: dict | None, curve) -> float:
    """The goal a projection aims at: where the output's range leaves a floor above the made-up target's goal, the
    point _within_range passes at (the floor plus target_ratio of the way from the start to it). A sweep: a ReLU map
    against a normal target, its floor 0.31 x the start, was "about 50207 more steps" from 0.01 x (never reachable):
    "train longer: --steps 63000"."""
    if (not out_of_range or out_of_range.get("span") or curve.first_terms or opts.target_loss is not None
            or initial is None):
        return goal
    floor = out_of_range.get("floor") or 0.0
    return max(goal, floor + opts.target_ratio * (initial - floor)) if 0 < floor < initial else goal


def _features_not_logits(result, curve, opts, ctx) -> bool:
    """Cross-entropy against torchdiag's random classes over an output >= 0 at the start and the end (causes.
    nonneg_logits: pooled ReLU features, a backbone built headless): every sample's answer right and the loss at
    NONNEG_FALL of its start or below is a model that learns, slowed by an output that can only raise the target's
    value (a warning, INCONCLUSIVE). Short of that, a note beside the verdict."""
    d = result.data
    initial, final, acc = d["initial_loss"], d["final_loss"], d["final_accuracy"]
    if opts.target_loss is not None or initial is None or final is None or not 0 < initial or not math.isfinite(final):
        return False
    if acc != 1.0 or final > NONNEG_FALL * initial:
        return False
    result.add("made-target-nonnegative", "warning", "", "cross-entropy against the classes torchdiag drew over an "
               "output ≥ 0 (the note above). Every sample's answer is right and the loss is "
               f"{final / initial:.3g} × its start ({_fmt(initial)} → {_fmt(final)}): the model learns; whether it "
               "memorises a batch is not told by this target",
               hint="if these are its logits, drop the activation after the last layer (cross-entropy applies "
                    "log-softmax to raw logits itself); if features, judge it with a head, or against its real targets: "
                    f"{ctx.option('batch')} with them, or a {ctx.option('loss')} PATH:fn of your own")
    result.verdict = (f"INCONCLUSIVE: cross-entropy over an output ≥ 0 (features, not logits); every answer right, loss "
                      f"{_fmt(initial)} → {_fmt(final)} in {curve.step} step(s)")
    return True


def _within_range(result, curve, opts, out_of_range: dict | None) -> bool:
    """The loss reached the floor that torchdiag's own random target leaves an output of a fixed range (causes'
    made_target_floor): what is left of the fall from the start to that floor is within the target ratio. The
    batch is memorised as far as that output can go; info, PASS."""
    d = result.data
    initial, final = d["initial_loss"], d["final_loss"]
    if not out_of_range or opts.target_loss is not None or initial is None or final is None or curve.first_terms:
        return False   # (several terms: each against its own floor, _at_term_floors)
    floor = out_of_range["floor"]
    if not (0 < floor < initial and math.isfinite(final)):
        return False
    below = ("the closest output in that range torchdiag fitted to it gets to" if out_of_range.get("fitted")
             else "no output in that range gets below")   # a fit is an estimate from above, not a bound
    if out_of_range.get("span"):   # never a PASS: shrinking the output toward 0 gets most of a big start's fall
        return _out_of_reach(result, out_of_range, initial, final, floor)
    if final - floor > opts.target_ratio * (initial - floor):   # said, the verdict as it is: a sigmoid or tanh nears
        result.notes.append(   # its bounds only as its logits grow without end, and the floor lies at those bounds
            f"every output value keeps to {out_of_range['kind']}: against the random target torchdiag drew, {below} "
            f"{_fmt(floor)} ({floor / initial:.3g} × the start); the loss went "
            f"{100 * (initial - final) / (initial - floor):.0f}% of the way there (judge it against its real targets: "
            "--batch, or a --loss PATH:fn)")
        return False
    d.update(passed=True, floor=floor)
    result.add("made-target-out-of-range", "info", "", f"every output value keeps to {out_of_range['kind']}, and "
               f"the random target torchdiag drew (normal, mean 0, std 1) lies partly outside it: {below} "
               f"{_fmt(floor)} ({floor / initial:.3g} × the start); the loss reached {_fmt(final)}, the "
               f"batch memorised as far as the range allows. If the real targets go beyond that range ("
               f"{out_of_range.get('real') or real_beyond(out_of_range['kind'])}), the output cannot "
               "fit them: that is a bug",
               hint="judge it against its real targets: --batch with them, or a --loss PATH:fn of your own")
    result.verdict = (f"PASS: the batch is memorised within the output's range ({out_of_range['kind']}): loss "
                      f"{_fmt(initial)} → {_fmt(final)}, its floor {_fmt(floor)}")
    return True


SPAN_WAY = 0.9   # of the way from what the features before training fit to the span's floor: the model learned
SPAN_GAP = 1.25  # ... told only where those features leave this many times the floor (rows near h: both alike)
SPAN_WAY_PAST = 0.25   # ... and past the best answer alike for every sample by this share of its way to the floor


def _out_of_reach(result, out_of_range: dict, initial: float, final: float, floor: float) -> bool:
    """The random target lies outside what the last layer's span can make (span.py), and the loss went most of the
    way from what a least-squares fit on the layer's inputs before training leaves (a frozen or dead trunk's end) to
    the span's floor (a bound from below: a normalisation before the layer keeps its rows on a sphere, which costs
    more): the model learned, and whether it memorises is not told by this target. A warning, not cannot-overfit.
    Measured from the start instead, a frozen trunk under inputs 30x too large passed (a review: its first output
    far off a target of variance 1, shrinking it earned 97% of the fall). Otherwise a note, the verdict as it is."""
    fixed, constant = out_of_range.get("fixed"), out_of_range.get("constant")
    way = (fixed - final) / (fixed - floor) if fixed is not None and fixed >= SPAN_GAP * floor else None
    if way is not None and constant is not None and constant > floor and final > constant - SPAN_WAY_PAST * (constant - floor):
        way = None   # an answer the same for every sample gets that far: a model that ignores its input could (a review)
    said = (f"every output keeps to {out_of_range['kind']}, and the random target torchdiag drew (normal, mean 0, std "
            f"1) does not: no output gets below {_fmt(floor)} ({floor / initial:.3g} × the start)")
    if way is None or way < SPAN_WAY:
        known = f"; the layer's inputs before training fit it to {_fmt(fixed)}" if fixed is not None else ""
        result.notes.append(f"{said}{known}; the loss reached {_fmt(final)} (judge it against its real targets: "
                            "--batch, or a --loss PATH:fn)")
        return False
    result.add("made-target-out-of-reach", "warning", "",
               f"{said}. The loss went {100 * way:.0f}% of the way there from {_fmt(fixed)}, what the layer's inputs "
               f"before training fit ({_fmt(initial)} → {_fmt(final)}), so the model learns; whether it memorises a "
               "batch is not told by this target",
               hint="judge it against its real targets: --batch with them, or a --loss PATH:fn of your own")
    result.verdict = (f"INCONCLUSIVE: the made-up target is beyond the last layer's span; the loss went {100 * way:.0f}% "
                      f"of the way to its floor ({_fmt(initial)} → {_fmt(final)}, floor {_fmt(floor)})")
    return True


def _same_rows(trainer, labels: list[str]) -> list[str]:
    """Of the outputs `labels`, those whose rows along the batch dimension (the first of the batch's size: a
    sequence-first output's is dim 1) are all equal on the trained copy and that still depend on the batch: with
    every batch-first input replaced by its first sample, the row changes or stops being finite (a head over the
    batch's mean, or over its spread). A constant of the model's own broadcast to every row (a learned temperature,
    a review's) is the same whatever the batch holds, and is no fault; a model that refuses a batch of one sample
    repeated (a Cholesky of the batch's covariance) cannot tell, and is not blamed. Two no-grad forwards, at a
    failure only."""
    import torch

    from ...core.loss import float_outputs
    from .causes import same_flag

    n = trainer.batch.batch_size

    def rows(batch) -> dict:
        with torch.no_grad(), trainer.autocast():
            out = batch.call(trainer.work)
        found = {}
        for k, t in float_outputs(out):
            dims = [d for d in range(t.dim()) if t.shape[d] == n] if k in labels else []
            if dims:
                found[k] = t.detach().movedim(dims[0], 0)
        return found

    first = rows(trainer.batch)
    flags = [(k, f) for k, t in first.items() if (f := same_flag(t)) is not None]
    if not flags:
        return []
    read = torch.stack([f[0].float().to(flags[0][1][0].device) for _, f in flags]).tolist()
    same = [k for (k, _), v in zip(flags, read) if v == 1.0]
    if not same:
        return []
    one = trainer.batch.map(lambda t: t[:1].expand_as(t).clone() if t.dim() and t.shape[0] == n else t)
    try:
        again = rows(one)
    except Exception:   # noqa: BLE001 - it refuses the repeated batch: whether the rows depend on it is not known
        return []
    asked = [k for k in same if k in again and again[k].shape == first[k].shape]
    if not asked:
        return []
    # the first row's move when the rest of the batch changes, against float32 rounding of its size (one read);
    # a row that stops being finite moved
    moved = torch.stack([torch.nan_to_num((again[k][0].float() - first[k][0].float()).abs().amax(), nan=math.inf)
                         - 1e-6 * (1 + first[k].float().abs().amax()) for k in asked]).tolist()
    return [k for k, d in zip(asked, moved) if d > 0]


def _frozen_words(trainer) -> str:
    """The frozen layers, by module, as a lead for a failure with no cause found (a sweep: a BERT whose classifier
    was frozen by mistake got "try more --steps")."""
    if not trainer.frozen:
        return ""
    from ...core.repeats import compact

    mods = list(dict.fromkeys(n.rpartition(".")[0] or "(root)" for n, p in trainer.work.named_parameters()
                              if not p.requires_grad))
    return (f"; or unfreeze: {trainer.frozen} parameter tensor(s) are frozen (requires_grad=False), in module(s) "
            f"{compact(mods, 4)}, and a frozen layer (an output layer above all) can keep a batch out of reach")


def _at_bounded_floor(result, causes, opts, ctx) -> bool:
    """The cross-entropy torchdiag chose itself (--loss auto) read a squashed output (a multi-label sigmoid, a tanh
    policy: bounded-output, each value bounded alone) and reached the floor that range leaves it, every sample
    predicted right: the batch is
    memorised as far as the made-up loss can tell; PASS, and bounded-output is info (it is the loss torchdiag picked
    that does not fit the output, not the model). A review: a sigmoid multi-label head at 1.46317 against its floor
    1.461, batch accuracy 100%, was cannot-overfit, an error. A loss the user chose, and rows that are each a
    distribution (a softmax before cross-entropy: sample_models/broken_overfit_softmax.py), keep the error and the
    warning."""
    d = result.data
    bounded, initial, final = causes.bounded, d["initial_loss"], d["final_loss"]
    if (d["passed"] or bounded is None or bounded.get("distribution") or ctx.loss().kind != "auto"
            or opts.target_loss is not None
            or d["final_accuracy"] != 1.0 or initial is None or final is None or not math.isfinite(final)):
        return False
    floor = bounded["floor"]
    if not (0 < floor < initial and final - floor <= opts.target_ratio * (initial - floor)):
        return False
    d.update(passed=True, floor=floor)
    result.findings = [f for f in result.findings if f.code not in ("bounded-output", "cannot-overfit")]
    lo, hi = bounded["box"]
    kept = ("every output row has norm 1 (an L2 normalisation at the end)" if bounded.get("sphere") else
            f"every output value stays within [{lo:.3g}, {hi:.3g}] (a sigmoid or tanh at the end)")
    result.add("bounded-output", "info", "", f"{kept}, and the cross-entropy torchdiag chose for it cannot go below "
               f"{_fmt(floor)} with {bounded['classes']} classes; the loss reached {_fmt(final)} with every sample "
               "predicted right: memorised as far as that loss can tell. Trained with cross-entropy, such an output "
               "would be a bug (the loss applies log-softmax itself)",
               hint=f"judge it with the loss it is trained with: {ctx.option('loss')} mse, PATH:fn, or --batch")
    result.verdict = (f"PASS: the batch is memorised as far as the output's range allows (batch accuracy 100%): loss "
                      f"{_fmt(initial)} → {_fmt(final)}, its floor {_fmt(floor)}")
    return True


def _at_its_floor(result, d, opts, ctx) -> None:
    """A custom loss that levelled above the target while every sample of the batch is predicted right: the batch
    is memorised, and the loss has a floor of its own (label smoothing's: the smoothed target's entropy; a
    regulariser's). A sweep: a label-smoothed cross-entropy at exactly its floor, 0.2911, was cannot-overfit with
    "try more --steps"."""
    initial, final = d["initial_loss"], d["final_loss"]
    d["memorised"] = True
    result.add("loss-floor", "warning", "", f"every sample of the batch is predicted right (batch accuracy 100%) and "
               f"the loss levelled at {_fmt(final)}, {final / initial:.3g} × initial, above the target "
               f"({opts.target_ratio:g} × initial): a floor of the loss itself (label smoothing, a regulariser)",
               hint=f"judge it by the loss's own floor: {ctx.option('target_loss')} {_fmt(final * 1.01)}")
    result.verdict = (f"PASS: the batch is memorised (batch accuracy 100%); the loss levelled at {_fmt(final)}, its own "
                      "floor, above the target")


def _beyond_capacity(result, trainer, few, bits: list[str], done: int) -> str:
    """A model with fewer trainable values than the batch's target values that memorises two of its samples on a
    fresh copy (capacity.py): info capacity-limited, "held". Not asked, not memorised, a failure there: a note,
    "" (the error stands); Ctrl-C there: the result interrupted, "interrupted"."""
    from ...errors import DiagError
    from .capacity import CODE, memorised

    if few is None:
        return ""
    try:
        small = few(done)
    except DiagError as exc:   # the two rows' forward or loss refused them: the run judged stands
        result.notes.append(f"two of the batch's samples on a fresh copy, to tell capacity from a fault, failed: "
                            f"{exc.message}")
        return ""
    if small is None:
        return ""
    c, n, d = small.curve, trainer.samples, result.data
    if _further(result, "few_samples", c, "two of the batch's samples trained on a fresh copy", samples=small.samples):
        return "interrupted"
    held = f"{d['trainable_values']:,} trainable values for {trainer.loss_fn.target.numel():,} target values"
    if not memorised(small):
        result.notes.append(f"the model has {held}, yet two of its samples (batch rows {small.samples[0]} and "
                            f"{small.samples[1]}, different targets) on a fresh copy were not memorised either: loss "
                            f"{_fmt(c.losses[0])} → {_fmt(c.losses[-1])} in {c.step} step(s)")
        return ""
    result.add(CODE, "info", "", f"could not memorise one batch of {n} in {trainer.curve.step} step(s) "
               f"({', '.join(bits)}); the model has {held}: fewer than the batch asks to fit, so it cannot interpolate "
               f"them in general; a fresh copy memorises two of its samples with different targets (batch rows "
               f"{small.samples[0]} and {small.samples[1]}: loss {_fmt(c.losses[0])} → {_fmt(c.losses[-1])} in "
               f"{c.reached_at} step(s)): the model, loss and optimizer train",
               hint="a batch no larger than the model can hold tests the training (--batch); a model meant to fit "
                    "more needs more trainable values")
    result.verdict = (f"PASS on two samples: {c.reached_at} step(s); the batch of {n} is beyond this model's "
                      f"capacity ({held}; {', '.join(bits)})")
    return "held"


def _further(result, key: str, c, what: str, **first) -> bool:
    """A further run's curve `c` said in the JSON under `key` (`first`'s entries, passed, steps, final_loss); True
    when Ctrl-C stopped it (the result then interrupted, said in a note)."""
    result.data[key] = {**first, "passed": c.reached_at is not None and not c.interrupted, "steps": c.step,
                        "final_loss": c.losses[-1] if c.losses else None}
    if c.interrupted:
        result.code, result.data["interrupted"] = int(c.interrupted), True
        result.notes.append(f"interrupted while {what}: the run's own numbers above are complete")
    return bool(c.interrupted)


def _noise_floor(result, trainer, held, bits: list[str], done: int) -> str:
    """A forward that drew random numbers (draws.py) whose loss learned through the noise (draws.learned), trained
    again on a fresh copy with the same draws at every step: memorised, warning sampled-loss and "held" (the run's
    failure is the noise's floor); not memorised, a note and "" (the error stands); not learned: "unlearned", nothing
    trained (the error stands, its hint says why); Ctrl-C there: "interrupted-held"."""
    from ...errors import DiagError
    from .draws import CODE, learned

    if held is None:
        return ""
    if not learned(trainer.curve.losses, trainer.loss_fn):
        return "unlearned"
    try:
        c = held(done)
    except DiagError as exc:
        result.notes.append(f"a fresh copy with its draws held fixed, to tell the noise from a fault, failed: {exc.message}")
        return ""
    if c is None:
        return ""
    if _further(result, "held_draws", c, "a fresh copy trained with its draws held fixed"):
        return "interrupted-held"
    if c.reached_at is None:
        result.notes.append(f"the forward draws random numbers; with the same draws at every step a fresh copy did not "
                            f"memorise the batch either: loss {_fmt(c.losses[0])} → {_fmt(c.losses[-1])} in {c.step} "
                            "step(s)")
        return ""
    n = trainer.samples
    result.add(CODE, "warning", "", f"could not memorise one batch of {n} in {trainer.curve.step} step(s) "
               f"({', '.join(bits)}) with fresh random draws at every step: the forward draws them (the RNG advanced "
               f"during it). With the same draws at every step a fresh copy memorises it (loss {_fmt(c.losses[0])} → "
               f"{_fmt(c.losses[-1])} in {c.reached_at} step(s)): the model, loss and optimizer train, and the noise "
               "sets the floor",
               hint="a sampled loss (a VAE's reparameterisation, injected noise, a random mask) has a floor above 0: "
                    "judge it with --target-loss; a draw where a weight belongs (torch.randn in forward) is a bug "
                    "(doctor: local-weight)")
    result.verdict = (f"PASS with its random draws held fixed: memorised in {c.reached_at} step(s); with fresh draws "
                      f"{', '.join(bits)}")
    return "held"


def _second_opinion(result, second) -> tuple[Any, bool]:
    """Ask the default optimizer (`second`: its Curve on a fresh copy, or None when not asked) and record what it
    did: (its Curve, whether it memorised the batch). A model that raises there leaves the run judged (a note); a
    Ctrl-C there makes the result interrupted; a failure there is a note."""
    from ...errors import ModelError

    if second is None:
        return None, False
    try:
        other = second()
    except ModelError as exc:   # the run judged stands; the copy's failure is not its verdict
        result.notes.append(f"{OPTIMIZER.describe()} on a fresh copy, asked for a second opinion, failed: {exc.message}")
        return None, False
    if other is None:
        return None, False
    d = result.data
    fits = other.reached_at is not None and not other.interrupted
    d["default_optimizer"] = {"optimizer": OPTIMIZER.describe(), "passed": fits, "steps": other.step,
                              "final_loss": other.losses[-1] if other.losses else None}
    if other.interrupted:
        result.code, d["interrupted"] = int(other.interrupted), True
        how = "SIGTERM" if other.interrupted == ExitCode.TERMINATED else "Ctrl-C"
        result.notes.append(f"interrupted with {how} while {OPTIMIZER.describe()} trained a fresh copy for a second "
                            "opinion: the run's own numbers above are complete")
    elif not fits:
        end = (f"diverged (a non-finite loss at step {other.nonfinite_at})" if other.nonfinite_at is not None else
               f"loss {_fmt(d['initial_loss'])} → {_fmt(other.losses[-1] if other.losses else None)}")
        result.notes.append(f"{OPTIMIZER.describe()} on a fresh copy did not memorise the batch either: {end} in "
                            f"{other.step} step(s)")
    return other, fits


def _optimizer_fails(result, ctx, other, steps: int) -> None:
    """The default optimizer memorised the batch the run's could not: the model, loss and data can fit it (the
    hint of a flat loss, which points at the model, says so too)."""
    for f in result.findings:
        if f.code == "flat-loss":
            f.hint = f"the model can learn the batch ({OPTIMIZER.describe()} memorises it): the step is what does not move it"
    refuted = [f for f in result.findings if f.code == "bounded-output"]   # read off a copy that barely moved
    if refuted:
        result.findings = [f for f in result.findings if f.code != "bounded-output"]
        result.notes.append(f"bounded-output withdrawn: {OPTIMIZER.describe()}'s copy went below the floor it claimed "
                            "(the run's outputs had only not moved out of that range)")
    result.add("optimizer-cannot-fit", "warning", "",
               f"{ctx.spec.optimizer.describe()} did not memorise the batch in {steps} step(s); "
               f"{OPTIMIZER.describe()} memorises it on a fresh copy in {other.reached_at} step(s): the model, loss "
               "and data can fit it, the optimizer or its learning rate is what fails here",
               hint=f"{ctx.option('optimizer')} {OPTIMIZER.name}, or another {ctx.option('lr')} "
                    f"(now {result.data['lr']:g})")


NEAR_FLOOR, FAR_FLOOR = 1.25, 3.0   # a first sighting is unsure while the loss is this far above the projected floor,
                                   # and that floor this close to the goal


def _unsure_floor(trend: Trend, final, initial, opts) -> bool:
    """A first sighting of a levelling loss that the run had no steps left to look at again (--steps, or the cap),
    projected close to the goal (within FAR_FLOOR of it) from far above (the loss still NEAR_FLOOR over it): the
    windowed geometric projection misfires there on healthy curves after a fast phase (a sweep: RoBERTa-PreLayerNorm
    at --steps 300 "levelling near 0.0815", 1.2x the goal, from 0.129; it passes at step 380, at 0.069; small MLPs on
    random labels, 1.4-1.9x, half their loss still to fall). A review: logits clamped to [-2, 2], samples that
    collide, a dead channel were 6-56x the goal and within 0.5% of their floor: a floor, the error stands."""
    if trend.floor is None or final is None or initial is None:
        return False
    goal = goal_of(initial, opts)
    return 0 < goal and trend.floor <= FAR_FLOOR * goal and final >= NEAR_FLOOR * trend.floor


def _not_yet(result, curve, opts, ctx, trend: Trend, second) -> None:
    """The budget ran out while the loss was still falling toward the target: a warning with the projection, or
    info when the default optimizer memorises the same batch on a fresh copy: the model can fit it, and the run's
    optimizer is only slower at its learning rate."""
    d, steps = result.data, curve.step
    total = steps + int(trend.to_go or 0)
    suggest = _round_up(int(total * 1.25))
    extended = f" (extended from {opts.budget})" if curve.budget > opts.budget else ""
    if curve.wrapped:   # a sweep: a healthy model passed at step 789 in one process, NOT YET at 500 under DDP
        extended = " (not extended under torchrun with --wrap: each rank's curve is its own rows')"
    message = (f"the loss is still falling when the budget of {curve.budget} step(s){extended} ends: "
               f"{_fmt(d['initial_loss'])} → {_fmt(d['final_loss'])}; at its recent trend the target is about "
               f"{trend.to_go} more step(s) away (≈{total} in all)")
    verdict = (f"NOT YET: loss {_fmt(d['initial_loss'])} → {_fmt(d['final_loss'])} in {steps} step(s), still "
               f"falling; ≈{total} steps projected to the target")
    if trend.kind == "levelling":
        suggest = _round_up(2 * steps)
        message = (f"the loss is still falling when the budget of {curve.budget} step(s){extended} ends, more slowly: "
                   f"{_fmt(d['initial_loss'])} → {_fmt(d['final_loss'])}, its recent trend levelling off near "
                   f"{_fmt(trend.floor)}, above the target; a first sighting, which the budget left no steps to look "
                   "at again (a slowing fall can be a phase of training)")
        verdict = (f"NOT YET: loss {_fmt(d['initial_loss'])} → {_fmt(d['final_loss'])} in {steps} step(s), still "
                   f"falling, its trend levelling off near {_fmt(trend.floor)} (a first sighting)")
    hint = f"train longer: {ctx.option('steps')} {suggest}, or a larger {ctx.option('lr')} (now {d['lr']:g})"
    other, fits = _second_opinion(result, second)
    if other is not None and other.interrupted:
        verdict = f"INTERRUPTED in the second opinion; the run itself: {verdict}"
    elif fits:
        message += (f"; {OPTIMIZER.describe()} memorises the same batch on a fresh copy in {other.reached_at} "
                    f"step(s): the model can fit it, this run's {ctx.spec.optimizer.describe()} is slower")
        hint = (f"{ctx.option('optimizer')} {OPTIMIZER.name}, or a larger {ctx.option('lr')} (now {d['lr']:g}), or "
                f"{ctx.option('steps')} {suggest}")
        verdict += f"; {OPTIMIZER.describe()} memorises it in {other.reached_at} step(s)"
    result.add("not-overfit-yet", "info" if fits else "warning", "", message, hint=hint)
    result.verdict = verdict


def _trend_note(result, trend: Trend) -> None:
    if trend.kind == "plateau":
        result.notes.append(f"the loss stopped improving: its best fell by less than {100 * PLATEAU_REL:g}% "
                            "over the last fifth of the steps")
    elif trend.kind == "levelling" and trend.floor is not None:
        result.notes.append(f"the loss is levelling off near {trend.floor:.4g}, above the target")


def _round_up(n: int) -> int:
    """n rounded up to 2 significant digits (a step count to suggest)."""
    if n < 100:
        return max(n, 1)
    scale = 10 ** (len(str(n)) - 2)
    return -(-n // scale) * scale


def _thin(values: list[float], width: int) -> list[float]:
    """At most `width` points for the sparkline: the minimum of each bucket (keeps drops visible)."""
    if len(values) <= width:
        return values
    out = []
    for i in range(width):
        lo, hi = i * len(values) // width, (i + 1) * len(values) // width
        chunk = [v for v in values[lo:hi] if math.isfinite(v)]
        out.append(min(chunk) if chunk else float("nan"))
    return out
