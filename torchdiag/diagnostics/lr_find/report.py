"""The lr-find Result: header (what ran and its cost), data (every number, for --json), series (the
curves), tables (the repeats, the rules side by side, the checked runs), findings and the verdict."""
from __future__ import annotations

import math

from ...errors import ExitCode
from ...results import Column, Result, Table
from .rules import RULES, Check, judge, pick

LABEL = {0.1: "0.1×", 1.0: "1×", 10.0: "10×"}
WIDE = 10.0        # repeats (or rules) further apart than 10×: say so


def g(v) -> str:
    return "—" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.3g}"


def span(lo, hi) -> str:
    """lo–hi, or the one value where they read the same (not "1.29–1.29")."""
    a, b = g(lo), g(hi)
    return a if a == b else f"{a}–{b}"


def describe_optimizer(spec) -> str:
    if spec.name == "sgd":
        return f"SGD (momentum {spec.momentum:g})" if spec.momentum else "SGD"
    return "AdamW (weight_decay 0.01)" if spec.name == "adamw" else "Adam"


def build(runner, analyses, suggestion, opts, ctx, interrupted: int = 0) -> Result:
    result = Result("lr-find")
    checks = [judge(Check(f, lr, losses), suggestion.tol, opts.diverge, runner.start_spread or 0.0, spread)
              for f, lr, losses, spread in runner.checks]
    done = suggestion is not None and len(checks) == len(LABEL)
    ceiling = _climbs_from(runner, analyses)
    best = pick(checks, suggestion.tol, ceiling) if done else None
    _header(result, runner, opts, ctx)
    _data(result, runner, analyses, suggestion, checks, best, opts, ctx)
    _tables(result, runner, analyses, suggestion, checks, best)
    _series(result, runner, analyses, checks)
    if interrupted:
        result.code = interrupted
        how = "SIGTERM" if interrupted == ExitCode.TERMINATED else "Ctrl-C"
        result.verdict = f"INTERRUPTED after {runner.updates} update(s): partial result, no suggestion"
        result.notes.append(f"interrupted with {how}: the numbers above are up to the last update")
        return result
    _curve_findings(result, runner, analyses, suggestion, opts, ctx)
    if suggestion.lr is not None:
        _check_findings(result, suggestion, checks, best, opts, ceiling)
    _verdict(result, suggestion, checks, best, opts)
    if ctx.spec.optimizer.lr is not None:
        result.notes.append(f"{ctx.option('lr')} {ctx.spec.optimizer.lr:g} is not used: the range test sets the rate of every update")
    return result


def _climbs_from(runner, analyses) -> float | None:
    """The rate from which the range test's smoothed loss climbed past its lowest point by more than its noise
    (tol), for good: the median over the repeats that fell (None where none climbed before it ended). A loss at its
    floor stays there until the rate turns unstable (least squares: flat from 1.6e-3 to ~0.1); one that climbs right
    after its lowest point is told the larger rates by that climb (a post-LN transformer, lowest at 0.0102)."""
    import statistics

    found = []
    for rep, a in zip(runner.repeats, analyses):
        if a.status != "ok" or a.min_index is None:
            continue
        low = a.smooth[a.min_index]
        up = [i for i in range(a.min_index + 1, len(a.smooth)) if a.smooth[i] > low + a.tol]
        if up and all(v > low + a.tol for v in a.smooth[up[0]:]):
            found.append(rep.lrs[up[0]])
    return statistics.median(found) if found else None


def _header(result, runner, opts, ctx) -> None:
    ratio = (opts.max_lr / opts.min_lr) ** (1 / (opts.steps - 1))
    amp = ctx.autocast_dtype
    result.header.update({
        "loss_rule": runner.loss_rule or "—",
        "training": f"{describe_optimizer(ctx.spec.optimizer)}, fresh copies of the model in train mode"
                    + (f", autocast {amp}" if amp else "") + " (your model is not changed)",
        "schedule": f"{opts.steps} updates per repeat, lr {opts.min_lr:g} → {opts.max_lr:g} (×{ratio:.4g} per update); "
                    f"a repeat stops when its smoothed loss exceeds {opts.diverge:g} × its best",
        "repeats": f"{opts.repeats}, seeds {ctx.seed}…{ctx.seed + opts.repeats - 1}; the seed varies {' and '.join(_varied(runner))}",
        "check": (f"{opts.check_steps} updates at each of 0.1×, 1×, 10× the suggestion, from the same weights, batch and seed"
                  if opts.check_steps else "none (check_steps 0): the suggestion is not checked"),
        "cost": f"at most {opts.cost} updates ({opts.steps} × {opts.repeats} range test + 3 × {opts.check_steps} checked)",
    })


def _varied(runner) -> list[str]:
    """What the seed of a repeat changes: the RNG of the forward always; the targets only when torchdiag
    drew them (not a --batch/given target, nor the model's own loss)."""
    return (["the random targets torchdiag draws"] if runner.made_target else []) + \
        ["the RNG of the forward (dropout, sampling)"]


def _data(result, runner, analyses, s, checks, best, opts, ctx) -> None:
    reps = runner.repeats
    identical = runner.identical()
    result.data.update({
        "suggestion": None if s is None else s.lr,
        "band": None if s is None or s.band is None else list(s.band),
        "band_ratio": None if s is None else s.band_ratio,
        "recommended": None if best is None else best.lr,
        "recommended_factor": None if best is None else best.factor,
        "status": "interrupted" if s is None else s.status,
        "rules_lr": {} if s is None else {k: {"median": v[0], "low": v[1], "high": v[2]} for k, v in s.rules.items()},
        "rule_ratio": None if s is None else s.rule_ratio,
        "ok_repeats": 0 if s is None else s.ok,
        "noise_tol": None if s is None else s.tol,
        "varied": _varied(runner), "repeats_identical": identical,
        "diverged_at_lr": [r.stop_lr for r in reps],
        "min_lr": opts.min_lr, "max_lr": opts.max_lr, "steps": opts.steps, "diverge": opts.diverge,
        "repeat_count": opts.repeats, "repeats_run": len(reps), "check_steps": opts.check_steps,
        "max_updates": opts.cost, "updates": runner.updates,
        "optimizer": ctx.spec.optimizer.name,
        "momentum": ctx.spec.optimizer.momentum if ctx.spec.optimizer.name == "sgd" else None, "amp": ctx.autocast_dtype or "none", "seed": ctx.seed,
        "seconds_range": round(runner.range_seconds, 3), "seconds_check": round(runner.check_seconds, 3),
        "seconds": round(runner.range_seconds + runner.check_seconds, 3),
        "batch_size": runner.batch.batch_size,
    })
    if identical:
        skipped = opts.repeats - len(reps)
        result.notes.append("the repeats gave identical curves: nothing random changes between them here (given "
                            "targets or the model's own loss, no dropout), so the band shows no run-to-run spread"
                            + (f"; the other {skipped} repeat(s) were skipped" if skipped else ""))
    result.artefacts["lr_find"] = {
        "repeats": [(r.lrs, r.losses, a.smooth) for r, a in zip(reps, analyses)],
        "checks": [(c.factor, c.lr, c.losses) for c in checks],
        "suggestion": None if s is None else s.lr, "band": None if s is None else s.band,
        "recommended": None if best is None else best.lr,
    }


def _tables(result, runner, analyses, s, checks, best) -> None:
    curves = Table("curves", "Range test: one curve per repeat", [
        Column("seed", "seed", "int"), Column("status", "curve"), Column("initial_loss", "initial loss", "float"),
        Column("min_loss", "lowest (smoothed)", "float"), Column("min_lr", "at lr", "float"),
        Column("valley", "valley", "float"), Column("stopped", "stopped"), Column("stop_lr", "at lr", "float"),
        Column("updates", "updates", "int")])
    for r, a in zip(runner.repeats, analyses):
        m = a.min_index
        curves.rows.append({"seed": r.seed, "status": a.status, "initial_loss": r.initial,
                            "min_loss": None if m is None else a.smooth[m], "min_lr": None if m is None else r.lrs[m],
                            **{k: a.rules.get(k) for k in RULES}, "stopped": r.stopped or "—",
                            "stop_lr": r.stop_lr, "updates": len(r.lrs) + (r.stopped == "non-finite"), "noise": a.sigma})
    result.tables.append(curves)
    if s is not None and s.rules:
        rules = Table("rules", "The point rules side by side (over the repeats whose curve fell)", [
            Column("rule", "rule"), Column("lr", "lr (median)", "float"), Column("low", "lowest", "float"),
            Column("high", "highest", "float"), Column("vs", "× suggestion", "float")],
            note="valley: middle of the descent (the suggestion) · steepest: fastest fall per decade · "
                 "min/10: the lowest point's rate ÷ 10")
        for rule in RULES:
            med, low, high = s.rules[rule]
            rules.rows.append({"rule": rule, "lr": med, "low": low, "high": high, "vs": med / s.lr})
        result.tables.append(rules)
    if checks:
        table = Table("checked", "Checked runs: the same weights, batch and seed at three rates", [
            Column("factor", "rate"), Column("lr", "lr", "float"), Column("initial", "initial loss", "float"),
            Column("final", "final loss", "float"), Column("outcome", "outcome"), Column("_pick", "")])
        for c in checks:
            table.rows.append({"factor": LABEL.get(c.factor, f"{c.factor:g}×"), "lr": c.lr, "initial": c.losses[0],
                               "final": c.final, "outcome": _outcome(c), "diverged": c.diverged, "unstable": c.unstable,
                               "trained": c.trained, "_pick": "← recommended" if c is best else ""})
        result.tables.append(table)


def _outcome(c: Check) -> str:
    return "diverged" if c.diverged else "unstable" if c.unstable else "trained" if c.trained else "did not train"


def _series(result, runner, analyses, checks) -> None:
    longest = max(runner.repeats, key=lambda r: len(r.lrs), default=None)
    result.series["lr"] = list(longest.lrs) if longest else []
    for i, (r, a) in enumerate(zip(runner.repeats, analyses)):
        result.series[f"loss_r{i}"] = list(r.losses)
        result.series[f"smoothed_r{i}"] = list(a.smooth)
    for c in checks:
        result.series[f"checked_{LABEL.get(c.factor, c.factor).replace('×', 'x')}"] = list(c.losses)


def _nonfinite_batch(batch, ctx) -> list[str]:
    """The batch's inputs and target holding NaN/Inf (a sweep: a NaN in the data was sent to nancheck the model)."""
    import torch

    named = list(batch.tensors()) + [("target", ctx.batch_target)]
    return [name for name, t in named if isinstance(t, torch.Tensor) and t.is_floating_point()
            and not bool(torch.isfinite(t).all())]


def _curve_findings(result, runner, analyses, s, opts, ctx) -> None:
    lo, hi = ctx.option("min_lr"), ctx.option("max_lr")
    reps = runner.repeats
    if reps and not math.isfinite(reps[0].initial):
        bad = _nonfinite_batch(runner.batch, ctx)
        result.add("non-finite-loss", "error", bad[0] if bad else "", f"the loss before any update is "
                   f"{reps[0].initial}: nothing to measure" + (f"; the batch itself holds NaN/Inf ({', '.join(bad)})"
                                                               if bad else ""),
                   hint="the data, not the model: `torchdiag data` names the samples" if bad else
                   "run `torchdiag nancheck` on this model")
        return
    stops = [r.stop_lr for r in reps if r.stop_lr is not None]
    if stops:
        why = sorted({r.stopped for r in reps if r.stopped})
        early = [lr for lr in stops if lr < opts.max_lr * (1 - 1e-6)]   # at the last rate nothing above was tried
        if not early:                                                     # (a sweep: "stopped early" at --max-lr)
            result.add("diverges-above", "info", "", f"{len(stops)} of {len(reps)} repeat(s) ended at the range's last "
                       f"rate, lr {g(opts.max_lr)} ({hi}), {' or '.join(why)}: the loss blows up there")
        else:
            result.add("diverges-above", "info", "", f"{len(early)} of {len(reps)} repeat(s) stopped early "
                       f"({', '.join(why)}) at lr {span(min(early), max(early))}: above that the loss blows up")
    if s.status == "rises":
        up = [a for a in analyses if a.status == "rises"]
        # the raw losses: a repeat stopped at its first update has a smoothed start halfway to its blow-up
        rep = next((r for r, a in zip(reps, analyses) if a.status == "rises"), None)
        start, low = ((rep.initial, min(rep.losses, default=rep.initial)) if rep is not None and len(reps) == len(analyses)
                      else (up[0].start, min(up[0].smooth, default=up[0].start)))
        result.add("no-rate-trains", "error", "", f"no rate in {g(opts.min_lr)}–{g(opts.max_lr)} reduced the loss "
                   f"(start {g(start)}, lowest after an update {g(low)}); it rose or diverged "
                   f"in {len(up)} of {len(analyses)} repeat(s)",
                   hint="the gradient does not lead down: check the loss's sign, a custom backward, or that the "
                        f"rates tried are not all too high (lower {lo})")
    elif s.status in ("flat", "noise", "split"):
        why = {"flat": f"the loss did not move beyond 1% of its start at any rate in {g(opts.min_lr)}–{g(opts.max_lr)}",
               "noise": "what the loss did stays within its noise (3σ of the step-to-step scatter)",
               "split": f"only {s.ok} of {len(analyses)} repeats fell clearly: the repeats disagree"}[s.status]
        hint = {"flat": f"raise {hi}, or the model does not respond to its parameters (try `torchdiag gradflow`)",
                "noise": f"more {ctx.option('repeats')}, a larger batch, or less dropout",
                "split": f"more {ctx.option('repeats')} or a larger batch"}[s.status]
        result.add("no-suggestion", "warning", "", f"no suggestion: {why}", hint=hint)
    if s.lr is None:
        return
    ok = [a for a in analyses if a.status == "ok"]
    if any(a.still_falling for a in ok):
        result.add("range-too-narrow", "warning", "", f"the loss was still falling at max_lr {g(opts.max_lr)}: the "
                   "suggestion is bounded by the range", hint=f"raise {hi}")
    if any(a.falls_at_once for a in ok):
        result.add("range-too-narrow", "warning", "", f"the loss was already falling at min_lr {g(opts.min_lr)}: the "
                   "descent may start below the range", hint=f"lower {lo}")
    if s.band_ratio is not None and s.band_ratio > WIDE:
        result.add("unsure-suggestion", "warning", "", f"the repeats' suggestions span {g(s.band[0])}–{g(s.band[1])} "
                   f"({s.band_ratio:.3g}×): the curve changes with the seed", hint=f"more {ctx.option('repeats')} or a larger batch")
    if s.rule_ratio is not None and s.rule_ratio > WIDE:
        meds = ", ".join(f"{k} {g(v[0])}" for k, v in s.rules.items())
        result.add("rules-disagree", "info", "", f"the point rules differ by {s.rule_ratio:.3g}× ({meds}): the checked "
                   "runs decide")


def _check_findings(result, s, checks, best, opts, ceiling: float | None = None) -> None:
    if not checks:
        return
    by = {c.factor: c for c in checks}
    base, low, high = by[1.0], by[0.1], by[10.0]
    from .rules import clearly_better

    if base.diverged:
        result.add("lr-too-high", "warning", "", f"at the suggested rate {g(base.lr)} the checked run diverged "
                   f"(loss {g(base.losses[0])} → {g(base.final)} in {opts.check_steps} updates)")
    elif clearly_better(low, base, s.tol) and best is low:
        result.add("lr-too-high", "warning", "", f"0.1× the suggestion ({g(low.lr)}) trained clearly faster than the "
                   f"suggestion {g(base.lr)}: final loss {g(low.final)} vs {g(base.final)} after {opts.check_steps} updates")
    if base.unstable:
        result.add("lr-unstable", "warning", "", f"at the suggested rate {g(base.lr)} the checked run gave back more "
                   f"than a quarter of its progress at some update (a rise of {g(base.rebound)})",
                   hint=f"a rate between 0.1× and 1× (e.g. {g(base.lr * 0.3)}) may train faster than 0.1× and stay stable")
    if best is base and ceiling is not None and high.lr > ceiling * (1 + 1e-6) and high.trained \
            and not high.unstable and clearly_better(high, base, s.tol):
        result.notes.append(f"10× the suggestion ({g(high.lr)}) trained faster on this batch (final loss "
                            f"{g(high.final)} vs {g(base.final)}) but lies past {g(ceiling)}, where the range test's loss "
                            "climbed from its lowest point for good: one batch favours large rates, so the suggestion stays")
    if best is high and not base.diverged:
        result.add("lr-too-low", "info", "", f"10× the suggestion ({g(high.lr)}) trained clearly faster on this batch "
                   f"and stayed stable: final loss {g(high.final)} vs {g(base.final)}",
                   hint="one batch favours large rates; on real data keep a margin below where the range test diverges")
    if best is None:
        result.add("no-rate-trains", "error", "", f"none of the checked rates {g(low.lr)}, {g(base.lr)}, {g(high.lr)} "
                   f"reduced the loss in {opts.check_steps} updates "
                   f"({', '.join(f'{LABEL[c.factor]} {_outcome(c)}' for c in checks)})",
                   hint="the curve's fall did not hold over a run at a constant rate; try more check_steps")


def _verdict(result, s, checks, best, opts) -> None:
    if s.lr is None:
        error = next((f for f in result.findings if f.severity == "error"), None)
        result.verdict = f"FAIL: {error.message}" if error else f"NO SUGGESTION: the curve is {s.status}"
        return
    head = f"lr {g(s.lr)} (band {span(*s.band)}, {s.ok} repeat(s))"
    if not checks:
        result.verdict = f"SUGGESTED {head}, not checked"
        return
    others = ", ".join(f"{LABEL[c.factor]} {_outcome(c)}" for c in checks)
    if best is None:
        result.verdict = f"FAIL: the suggestion {head} did not hold: {others}"
    elif best.factor == 1.0:
        result.verdict = f"SUGGESTED {head}; checked: {others}; 1× kept"
    else:
        result.verdict = (f"RECOMMENDED lr {g(best.lr)} = {LABEL[best.factor]} the curve's suggestion {g(s.lr)} "
                          f"(band {span(*s.band)}, {s.ok} repeat(s)); checked: {others}")
