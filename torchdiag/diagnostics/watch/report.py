"""The Result of a watched run, from the engine's host-side state (no tensor is read here).

Curve judgements use running medians over a window of w = clamp(n/10, 5, 50) steps, so one noisy
step never makes a finding; every threshold is an option (spike, explode, ratio_high) or stated here."""
from __future__ import annotations

import math
import os
import re
import statistics

from ...core.design import TINY_RMS
from ...core.lazy import is_uninitialised
from ...core.loss import probabilities_floor
from ...core.repeats import common_path, compact, cut
from ...results import Column, Result, Table
from .stats import CLOCK_STOPPED, Released, param_key

# a metric's direction by the names metrics are given; a lower-is-better word wins (top1_err, loss_giou)
LOWER_IS_BETTER = re.compile(r"loss|perplexity|mape|mapd|distance|incorrect|cross_?entropy|xent|nmse|rmsle|huber"
                             r"|regret|brier|lpips|chamfer|abs_rel|neg_log|cost|crps|energy|nelbo|negloglik|gap"
                             r"|(?<![a-z])(neg|negative|minus)_?(elbo|log|reward|return|likelihood)"   # negated
                             r"|(?<![a-z])(err|errors?|wer|cer|ppl|mse|mae|rmse|nll|fid|bpc|bpd|dist|ce|bce|kld?|ece|epe"
                             r"|l[12])(?![a-z0-9])", re.I)
HIGHER_IS_BETTER = re.compile(r"(?<![a-z])acc(?!ess)|f1|auc|auroc|aupr|precision|recall|bleu|rouge|score|iou(?!s)"
                              r"|(?<![a-z])m?a[pr](?![a-z])|top\d|dice|hit_rate"
                              r"|psnr|ssim|r2\b|ndcg|mrr|jaccard|(?<![a-z])corr(?!upt)|hits|reward|return|exact_match"
                              r"|spearman|pearson|kendall|elbo|log_?likelihood|loglik|success|win_rate|kappa|pass@"
                              r"|(?<![a-z])(ap(\d+|[sml])?|ar\d+|em|mcc)(?![a-z])", re.I)
# a loss or error negated so that higher is better (scikit-learn's neg_mean_squared_error, neg_log_loss): a loss on
# negatives (a contrastive neg_loss) is >= 0, a negated one <= 0, so the values must say it too. Not a negated
# log-likelihood or ELBO: that is a loss already (NLL), lower is better
NEGATED_LOSS = re.compile(r"(?<![a-z])(neg|negative|minus)[_-](?!log_?lik|elbo|log_?prob)[a-z_-]*?"
                          r"(loss|error|err|mse|mae|rmse|rmsle|mape|huber|nll|brier|deviance)(?![a-z])", re.I)
# an evidence lower bound: <= 0 for discrete data, where higher is better; a positive one is a density's or, as many VAE
# codes name it, the negated bound they minimise (a review: val_elbo falling with the training loss). A log-likelihood
# above 0 (a continuous density's) is higher-is-better: a second review
ELBO = re.compile(r"elbo", re.I)
DEAD_SHARE = 0.5       # a layer with at least this share of its units newly dead (twice in a row)
SPARED_READS = 5       # dead units a run spared: the median loss of this many steps before the death and at the end,
SPARED_FALL = 0.5      # the end's at most this × the death's (it kept learning without them): info
SPARED_ALIVE = 0.1     # and at least this share of the layer's units still alive at the last read (a layer with none passes nothing on)
SPREAD_K = 5.0         # a loss spike is this many robust standard deviations above the recent losses ...
SPREAD_STEPS = 4       # ... measured over this many windows before it
VAL_TAIL = 3           # val-worsens: the last evaluations (up to this many after the best) all worse than it ...
VAL_NOISE_K = 1.0      # ... their median by this many noise scales more than the best of n draws reaches by chance
GRID_N, GRID_TOL = 5000, 1e-4   # an accuracy's count of samples read from its values (k/n), and how near k each is,
GRID_MIN = 8                    # from this many values at least (fewer round values fit a small grid by chance)
LR_COLLAPSE = 1e-3     # lr-collapsed: the rate, as a share of its highest, under which a run trains nothing more
STEPPED_GAP = 4        # ... and the most steps between its changes of a scheduler that counts batches
ONE_BATCH = 1e-3       # ... under this spread of the log-loss from step to step, every step saw the same batch
DIVERGE_K = 3.5        # loss-diverged: the climb clears the block medians' own noise by this many noise scales
BLOWN_K = 3.0          # loss-diverged from the start: above the first loss by this many robust per-step spreads ...
BLOWN_GROWTH = 10.0    # ... while the weights' norm grew this many times over (steps too large for the weights)
BLOWN_PEAK = 10.0      # ... after every running median at 2x the first loss, or one at this many times it
IDLE_READS = 1         # optimizer-idle: whole read intervals after its last step in which a backward reached it
REACH_TURNS = 4        # changes between sets of parameters steps' gradients reached: tasks taken in turns, not phases
REACH_MIN = 10         # ... between sets of this many steps at least (a rarer set's steps join the nearest group)
REACH_LEVELS = 2.0     # ... whose losses' medians differ by this factor at least (_reach_groups)
PHASE_HELD = 0.95      # a term that joined the loss: the share of the steps after it whose gradient reached it (_phases)
RATIO_LOW = 1e-7       # update/weight ratio below which a weight matrix is said not to learn (info)
SANE_RATIO = 1e-3      # about what a healthy step moves a weight matrix by, as a share of its norm
RATE_FELL = 100.0      # the learning rate fell this many times: what made the updates small, whatever the gradient
GREW = 3.0             # weights grown this many times beyond a standard init's scale: not a rate too small ...
UPDATING = 3e-3        # ... where the updates still move them by this share of their norm a step (3x a healthy one)


def _frozen(engine) -> str:
    """The trained models' parameters that require no gradient and no optimizer holds, as of the last read, said
    (not judged: a frozen
    backbone is a choice; a layer frozen by mistake was in no table at all: a sweep's 87% of an MLP)."""
    count, total, names = engine.frozen
    if not count:
        return ""
    listed = ", ".join(names[:4]) + (f" … (+{len(names) - 4})" if len(names) > 4 else "")
    return (f"{count:,} of the {total:,} parameter values of the trained models ({count / total:.0%}) require no "
            f"gradient (requires_grad=False) and are in no optimizer: {listed}")


def window(n: int) -> int:
    return max(5, min(50, n // 10))


def running_medians(values: list[float], w: int) -> list[float]:
    return [statistics.median(values[max(0, i - w + 1): i + 1]) for i in range(len(values))]


def build(engine, interrupted: int | None = None, failure: str | None = None) -> Result:
    opts = engine.opts
    result = Result("watch")
    result.header["every"] = opts.every
    result.header["optimizers"] = _optimizers(engine)
    result.header["models"] = list(engine.models_seen)
    frozen = _frozen(engine)
    if frozen:
        result.header["frozen"] = frozen
    if opts.accumulate:
        result.header["accumulate"] = "gradients carried over steps on purpose: the zero_grad check is off"
    result.data["steps"] = engine.step
    result.data["reads"] = engine.reads
    result.data["epoch"] = engine.epoch
    rank = os.environ.get("RANK")
    if rank is not None and rank.isdigit():   # under torchrun each rank watches its own run
        result.data["rank"] = int(rank)
        result.header["torchrun"] = f"rank {rank} of {os.environ.get('WORLD_SIZE', '?')} (this rank's own run)"
    result.data["metrics"] = {k: [[s, v] for s, v in vals] for k, vals in engine.metrics.items()}
    result.data["hparams"] = hparams(engine)
    for key in ("step", "loss", "grad_norm", "lr"):
        result.series[key] = list(engine.series.get(key, []))
    _nonfinite(result, engine)
    _scaler(result, engine)
    _wiring(result, engine)
    _carried_into_nonfinite(result)
    _doubles(result, engine)
    _modes(result, engine)
    _eval_unreached(result, engine)
    _val_in_train(result, engine)
    _bn_momentum(result, engine)
    _dropout_rate(result, engine)
    _frozen_in_train(result, engine)
    _probabilities(result, engine)
    _curves(result, engine)
    _layers(result, engine)
    _dead(result, engine)
    if engine.broken:
        result.notes.append(engine.broken)
    for note in dict.fromkeys(engine.checks["unhooked"]):
        result.notes.append(note)
    if engine.run_compiled:
        result.notes.append("a watched model ran inside torch.compile (compiled by the run): dead units are not "
                            "checked, since hooks added to its layers would be traced into the compiled graph and "
                            "recompile it at every read; steps, loss, gradients and modes are watched")
    if engine.traced_forward and not engine.roots:
        result.notes.append("the trained model's forward ran inside torch.compile'd code (a compiled training step, "
                            "or a trainer's compiled step), where watch cannot hook it: its steps, loss and gradients "
                            "are watched, by their place in the optimizer; the model's own checks (parameters no "
                            "optimizer holds, eval mode, dead units, names) need its forward called outside compiled "
                            "code (torch.compile(model) called from a plain loop), or the model given "
                            "(torchdiag.watch(model))")
    if engine.compiled_parts:
        parts = sorted(engine.compiled_parts)
        result.notes.append(f"compiled parts of a watched model ({', '.join(parts[:4])}{' …' if len(parts) > 4 else ''}):"
                            " dead units are not checked inside them (hooks on their layers would be traced into "
                            "their graphs and recompile them at every read)")
    if engine.under_functorch:
        result.notes.append("a watched model ran under a torch.func transform (vmap, grad): dead units are not checked "
                            "in those forwards (their tensors are the transform's wrappers)")
    if engine.loss_seen is False and engine.step:   # no step: nothing to say of losses (a script that failed first)
        result.notes.append("no loss was seen (backward was not called on a scalar through Tensor.backward): "
                            "loss findings need one, or in Python w.log('loss', value)")
    _verdict(result, engine, interrupted, failure)
    result.data["final_metrics"] = final_metrics(result)
    _summary(result, engine)
    return result


def _summary(result: Result, engine) -> None:
    result.summary.append(("steps", f"{engine.step} optimizer steps, {engine.reads} read-backs"
                                    + (f", epoch {engine.epoch}" if engine.epoch is not None else "")))
    losses = [v for v in result.series["loss"] if v is not None and math.isfinite(v)]
    if losses:
        w = window(len(losses))
        # accumulation: a step's loss is the mean of what backward took, which a loop dividing by K makes 1/K of its
        # loss (a sweep read 0.57 for 2.26); said, as the tool cannot know K from the tensors
        micro = (f"; each step's the mean of the up to {engine.micro} losses its closure evaluated (a line search "
                 "evaluates the loss several times a step)" if engine.micro > 1 and engine.evaluates_often() else
                 f"; each step's the mean of the up to {engine.micro} losses its backward calls took, which a loop "
                 "dividing each by their count shows that many times smaller" if engine.micro > 1 else "")
        result.summary.append(("loss", f"{statistics.median(losses[:w]):.4g} → {statistics.median(losses[-w:]):.4g} "
                                       f"(median of the first and last {w}{_gone_bad(result)}{micro})"))
    lrs = [v for v in result.series["lr"] if v is not None]
    if lrs:   # the rates the steps used; the header's is the optimizer's after the last step (a schedule moved it)
        result.summary.append(("learning rate", f"{lrs[0]:.3g} → {lrs[-1]:.3g} (max {max(lrs):.3g})"))
    for name, pairs in engine.metrics.items():
        if pairs:
            result.summary.append((name, f"{pairs[-1][1]:.4g} at step {pairs[-1][0]} ({len(pairs)} logged)"
                                   if isinstance(pairs[-1][1], float) else str(pairs[-1][1])))


def hparams(engine) -> dict:
    out: dict = {}
    track = next(iter(engine.tracks.values()), None)
    if track is not None:
        group = track.group
        out["optimizer"] = track.kind
        for key in ("lr", "weight_decay", "momentum", "eps"):
            v = group.get(key)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                out[key] = float(v)
        if isinstance(group.get("betas"), tuple):
            out["beta1"], out["beta2"] = (float(b) for b in group["betas"])
    lrs = [v for v in engine.series.get("lr", []) if v is not None]
    if lrs:   # the rate the run started with (a schedule changes the group's value)
        out["lr"] = lrs[0]
        out["max_lr"] = max(lrs)
    if engine.batch_size is not None:
        out["batch_size"] = engine.batch_size
    out["every"] = engine.opts.every
    return out


def final_metrics(result) -> dict:
    """What add_hparams shows beside the hyperparameters: the final loss (median of the last window) and
    the last value of each metric the loop logged."""
    out = {}
    losses = [v for v in result.series.get("loss", []) if v is not None and math.isfinite(v)]
    if losses:
        out["final_loss"] = statistics.median(losses[-window(len(losses)):])
    for name, pairs in result.data.get("metrics", {}).items():
        if pairs and isinstance(pairs[-1][1], (int, float)):
            out[f"final_{name}"] = float(pairs[-1][1])
    return out


def _where_step(step, epoch) -> str:
    return f"step {step}" + (f" (epoch {epoch})" if epoch is not None else "")


def _nonfinite(result: Result, engine) -> None:
    for e in engine.events:
        params = e.get("params") or []
        what = "loss" if e["kind"] == "loss" else "gradient"
        where = params[0] if params and e["kind"] == "gradient" else ""
        when = "before the optimizer applied it" if e.get("before_update", True) else "read after that step's update"
        msg = f"first non-finite {what} at {_where_step(e['step'], e.get('epoch'))}, {when}"
        if e.get("norm_overflow"):   # finite gradients whose norm float32 cannot hold (engine._norm_overflow)
            msg = (f"first gradient norm past float32's range at {_where_step(e['step'], e.get('epoch'))}, {when} "
                   f"(the gradients themselves finite, the largest |g| {e['norm_overflow']:.3g})")
        if params:
            msg += (f"; parameters with a {'gradient norm past it' if e.get('norm_overflow') else 'non-finite gradient'}: "
                    f"{', '.join(params[:5])}" + (" …" if len(params) > 5 else ""))
        rep = e.get("replay")
        if rep and "error" not in rep:
            hint = f"replayed the batch on the weights of that step: {rep['detail']}"
            where = rep.get("module") or where
            result.data.setdefault("replay", rep)
        elif rep:
            hint = f"the replay itself failed: {rep['error']}"
        else:
            hint = e.get("replay_note") or "lower the learning rate, check the inputs of that batch, or clip gradients"
        result.add(f"non-finite-{what}", "error", where, msg, hint)
        result.data["first_non_finite_step"] = e["step"]
    if not engine.events:
        result.data["first_non_finite_step"] = None
    _dropped(result, engine)
    for name, step in engine.checks["param_nonfinite"].items():
        if not engine.events:
            result.add("non-finite-parameter", "error", name, f"parameter {name} is non-finite at step {step}",
                       "an update overflowed: lower the learning rate")
        break
    for name, step in engine.checks["bn_nonfinite"].items():
        result.add("non-finite-bn-stats", "error", name.rsplit(".", 1)[0],
                   f"BatchNorm statistic {name} is non-finite at step {step}",
                   "a non-finite activation reached the BatchNorm in training mode; eval outputs will be wrong")


def _carried_into_nonfinite(result: Result) -> None:
    """A non-finite loss or gradient in a run whose gradients were carried over between steps: each step applies the
    sum of every gradient since the start, which grows until it overflows (a sweep: LBFGS's closure without
    zero_grad, NaN at step 7, was told to check the data and lower the rate)."""
    if not any(f.code == "grad-carried-over" for f in result.findings):
        return
    for f in result.findings:
        if f.code in ("non-finite-loss", "non-finite-gradient") and "grad-carried-over" not in (f.hint or ""):
            f.hint = ("the gradients carried over between steps (grad-carried-over) add up each step until they "
                      "overflow: the likely cause; " + (f.hint or ""))


def _dropped(result: Result, engine) -> None:
    """Non-finite losses of steps that took a finite one too and applied finite gradients (engine._dropped): not the
    run's NaN, which the loop kept out of its updates (a step whose every loss was non-finite applied what they gave). As GradScaler's skips: a few are said as info, most of the steps as a warning."""
    if engine.dropped_losses is None:
        return
    first, count, event = engine.dropped_losses
    said = (f"{count} of {engine.step} steps took a non-finite loss beside a finite one (the first at step {first}) "
            "and applied finite gradients: the loop dropped those batches' gradients after their backward, or their "
            "non-finite part reached no parameter")
    rep = event.get("replay") if event else None
    if rep and "error" not in rep:
        hint = f"replayed the first batch on the weights of that step: {rep['detail']}"
    else:
        hint = "find the batches that give it (their inputs, their targets), or the part of the loss that does"
    level = "warning" if count >= max(10, engine.step // 2) else "info"
    result.add("non-finite-loss-dropped", level, "", said + (": half the steps or more lost a batch" if level == "warning"
                                                            else ""), hint)


def _scaler(result: Result, engine) -> None:
    """GradScaler's skipped steps (inf/NaN gradients at the scale then), counted on the host as its step() ran: a
    few while the scale settles are normal; every one skipped is a run that never trained (a sweep: a NaN every
    backward was "no optimizer step was seen", hinting at a hand-written update, to a user who called
    scaler.step)."""
    calls, applied = engine.scaler_calls, engine.scaler_applied
    skipped = calls - applied
    if not calls or skipped <= 0:
        return
    scaler = engine.scaler() if engine.scaler is not None else None
    scale = f", its scale {float(scaler.get_scale()):.3g} at the end" if scaler is not None else ""
    said = f"GradScaler skipped {skipped} of its {calls} steps: the gradients held inf or NaN then{scale}"
    hint = ("an inf or NaN the model or loss makes at any scale is not fixed by scaling (log(0), sqrt(0), x/0): "
            "`torchdiag nancheck MODEL --amp fp16` finds the module")
    if not applied:
        result.add("every-step-skipped", "error", "", f"{said}: no update was ever applied", hint)
    elif skipped >= max(10, calls // 2):
        result.add("steps-skipped", "warning", "", f"{said}: most updates were not applied", hint)
    else:
        result.notes.append(f"{said} (a few while the scale settles are normal)")


def _its_steps(t, engine) -> str:
    """The steps an optimizer took: the run's, or its own where another took some (a sweep: a LoRA's AdamW after 30
    steps of pre-training was said to have trained 260 steps, its 230 and the other's)."""
    return f"{engine.step} steps" if t.stepped >= engine.step else f"its {t.stepped} steps of the run's {engine.step}"


def _listed(names: list[str]) -> tuple[bool, str]:
    """(one tensor?, how the message names them): the name, or "N parameter tensors (compact list)"."""
    one = len(names) == 1
    return one, names[0] if one else f"{len(names)} parameter tensors ({compact(names)})"


IDLE_STEPS = 50   # the run's steps, at least, for an optimizer that never stepped to be said to leave its parameters untrained


def _idle_optimizer(result: Result, engine) -> None:
    """Parameters with a gradient held only by an optimizer that never stepped: a warning over IDLE_STEPS steps or
    more, else info (a run that stopped early, a smoke test of 4 steps whose generator steps every 5th)."""
    idle = engine.checks["idle_optimizer"]
    if not idle:
        return
    names, (one, what) = list(idle), _listed(list(idle))
    long = engine.step >= IDLE_STEPS
    result.add("not-in-optimizer", "warning" if long else "info", names[0] if one else common_path(names),
               f"{what} {'gets a gradient' if one else 'get gradients'} (first seen at the read of step "
               f"{min(idle.values())}) and {'is' if one else 'are'} held only by an optimizer that never stepped in "
               f"the {engine.step} step(s) watched" + (": never trained" if long else
                                                         " (a run this short may have ended before its first step)"),
               f"call that optimizer's step() after the backward that gives {engine.model_word(names[0])} its gradient",
               members=names if not one else None)


def _held_late(result: Result, engine) -> None:
    """Parameters that got gradients at a read while no live optimizer held them, and that an optimizer holds by the
    end: those steps' gradients were lost. Info: a part meant to train later looks the same as a stage's optimizer
    built over too little."""
    late = engine.checks["held_late"]
    if not late:
        return
    names, (one, what) = list(late), _listed(list(late))
    result.add("not-in-optimizer", "info", names[0] if one else common_path(names),
               f"{what} {'got a gradient' if one else 'got gradients'} at the read of step {min(late.values())} while no "
               f"optimizer held {'it' if one else 'them'}, and an optimizer built or grown later holds "
               f"{'it' if one else 'them'} at the end: the updates of the steps between were lost",
               "if an optimizer of that stretch was meant to hold them, pass them to it; if they were meant to wait, "
               "requires_grad_(False) until then saves their backward", members=names if not one else None)


def _wiring(result: Result, engine) -> None:
    whole = engine.checks.get("model_not_in_optimizer", {})
    for model, names in whole.items():
        step = min(engine.checks["not_in_optimizer"][n] for n in names)
        if model in engine.checks.get("model_in_eval", {}):   # put in eval, in no optimizer, never changed: a fixed
            result.add("not-in-optimizer", "info", model,   # network on purpose (a perceptual loss's; a review)
                       f"every trainable parameter of {model} ({len(names)} tensors) gets gradients (seen from step "
                       f"{step}), none is in an optimizer's param groups and none changed, and {model} was called in "
                       "eval mode: a fixed network, as a perceptual loss's",
                       f"{model}.requires_grad_(False) saves the backward into its weights; if it is meant to train, "
                       f"pass {model}.parameters() to its optimizer and call {model}.train()")
            continue
        result.add("not-in-optimizer", "warning", model, f"every trainable parameter of {model} ({len(names)} "
                   f"tensors) gets gradients (seen from step {step}) but none is in an optimizer's param groups, and none "
                   f"changed since: {model} never trains", f"pass {model}.parameters() to its optimizer (is another optimizer built over the "
                   "wrong model's parameters?)")
    by_hand = list(dict.fromkeys(engine.checks["updated_by_hand"]))
    if by_hand:   # a sweep: a temperature updated with `p -= lr * p.grad` was "never trains"; a review: a decay applied
        one = len(by_hand) == 1   # by hand to a head left out of the optimizer changes it too, so it is still said
        result.add("not-in-optimizer", "info", by_hand[0] if one else common_path(by_hand),
                   f"{by_hand[0] if one else f'{len(by_hand)} parameter tensors ({compact(by_hand)})'} "
                   f"{'gets' if one else 'get'} gradients in no optimizer's param groups, and changed over the run by "
                   "other means (an update written by hand, a decay, a copy): if nothing applies the gradients, "
                   f"{'it does' if one else 'they do'} not train", "nothing to do if the loop updates "
                   f"{'it' if one else 'them'} itself; else pass {'it' if one else 'them'} to the optimizer",
                   members=by_hand if not one else None)
    covered = {n for names in whole.values() for n in names}
    owners, region, tops = engine.checks["unowned_eval"], engine.checks["eval_region"], engine.checks["eval_top"]
    fed = _parts_fed(engine)
    probe = [n for n in engine.checks["not_in_optimizer"] if n not in covered and n in owners
             and n not in engine.checks["orphaned"] and region.get(owners[n]) and fed.get(tops.get(owners[n])) is False]
    if probe:   # a linear probe's body: put in eval and left out of the optimizer, both on purpose (a sweep)
        one = len(probe) == 1
        result.add("not-in-optimizer", "info", probe[0] if one else common_path(probe),
                   f"{probe[0] if one else f'{len(probe)} parameter tensors ({compact(probe)})'} "
                   f"{'gets a gradient' if one else 'get gradients'} but {'is' if one else 'are'} in no optimizer's "
                   f"param groups, and {'its module was' if one else 'their modules were'} put in eval mode while the "
                   "model trained: a frozen part, as in a linear probe",
                   f"requires_grad_(False) on {'it' if one else 'them'} saves the backward through {'it' if one else 'them'}; "
                   f"if {'it is' if one else 'they are'} meant to train, pass {'it' if one else 'them'} to the optimizer",
                   members=probe if not one else None)
        covered |= set(probe)
    _idle_optimizer(result, engine)
    _held_late(result, engine)
    groups: dict[bool, list[str]] = {}   # one finding per cause (a sweep: an unfrozen block's 4 tensors were 4)
    once: set = set()   # a tensor under two models' names (a backbone and the model around it) once (a sweep: 8 for 4)
    for name in engine.checks["not_in_optimizer"]:
        tensor = engine.unowned_id(name)
        if name not in covered and tensor not in once:
            once.add(tensor)
            groups.setdefault(name in engine.checks["orphaned"], []).append(name)
    for orphaned, names in groups.items():
        step = min(engine.checks["not_in_optimizer"][n] for n in names)
        one, what = _listed(names)
        why = (f"{'it was' if one else 'they were'} trained by an optimizer the run let go, and since then nothing "
               f"applies {'its' if one else 'their'} gradients" if orphaned else "it never trains" if one
               else "they never train")
        result.add("not-in-optimizer", "warning", names[0] if one else common_path(names),
                   f"{what} {'gets a gradient' if one else 'get gradients'} (first seen at the read of step {step}) but "
                   f"{'is' if one else 'are'} in no optimizer's param groups at the end: {why}",
                   f"pass {engine.model_word(names[0])}.parameters() (all of them) to the optimizer; for layers unfrozen "
                   "during the run, optimizer.add_param_group({'params': [...]}) them",
                   members=names if len(names) > 1 else None)
    judged = [t for t in engine.tracks.values() if not t.retired]   # a retired one's parameters are its heir's
    many, owners = len(judged) > 1, _owners(engine)
    for k, t in enumerate(judged):
        if _auxiliary(engine, t):
            continue
        where = _optimizer_where(t, k) if many else ""
        ignored = _loss_ignores(t, engine)
        if ignored:
            result.add("loss-ignores-parameters", "error", where,
                       f"none of the {len(ignored)} parameters {'this optimizer' if many else 'the optimizer'} trains got a "
                       f"non-zero gradient in {_its_steps(t, engine)} (every gradient exactly 0): the loss does not depend "
                       "on them", "the output or the loss is constant: e.g. a softmax over a single unit (always 1), "
                       "an output detached from the model, a loss computed on the wrong tensor, every unit dead, or a product "
                       "of factors all initialised to zero (a LoRA adapter's A and B both 0: each gradient is the other's "
                       "value)")
        if _starved(result, engine, t, judged, owners, where):
            continue
        _stopped(result, engine, t, where, judged)
        frozen = []   # never changed with its group's rate 0 at every read: one info for them all
        never: dict[str, list[str]] = {}   # never-gets-grad, per severity: one finding each (a sweep: a detached
        for i, p in enumerate(t.params):    # block's four weights were four findings, each with the same hint)
            if i in ignored or owners[param_key(p)] is not t or i in t.lazy and not is_uninitialised(t.lazy[i]):
                continue   # said once above; or another optimizer's row; or a lazy one made after the last read
            # never at a read step since it joined, and no non-zero norm at any step (the per-step rows): a sparse
            # MoE's expert routed to between reads got gradients (a review: experts 0 and 5 were named)
            # (empty: nothing to train, but a lazy module's never made: a module never called, as any other)
            if not _got_grad(t, i) and t.sampled > t.joined[i] and (p.numel() or i in t.lazy):
                shape = "lazy, never made" if i in t.lazy else _shape_of(p)   # a row named by index: its shape
                never.setdefault("warning" if p.requires_grad else "info", []).append(f"{t.names[i]} ({shape})")
            elif t.changed is not None and not t.changed[i] and _negligible(t, i):
                result.add("never-changes", "info", t.names[i], f"{t.names[i]} never changed over {_its_steps(t, engine)}: "
                           f"its gradient was zero or negligible at every step (at most {t.grad_max[i]:.2g})", "the model cancels it (e.g. a bias right "
                           "before a BatchNorm, which removes any constant): drop it, or look for what zeroes its gradient; "
                           "or the model had converged (a fine-tune from a converged checkpoint)")
            elif t.changed is not None and not t.changed[i] and t.lr_max[i] == 0 and _trains_some(t):
                frozen.append(t.names[i])
            elif t.changed is not None and not t.changed[i]:
                norm = t.weight_norm[i] if t.weight_norm else None
                scale = f" (largest gradient norm {t.grad_max[i]:.2g}" + (
                    f", weight norm {norm:.2g})" if norm is not None else ")")
                result.add("never-changes", "warning", t.names[i], f"{t.names[i]} got non-zero gradients but its value "
                           f"never changed over {_its_steps(t, engine)}{scale}", "a zero learning rate for its group, "
                           "gradients zeroed between backward and step(), or " + _rounded_away(p))
        for sev, rows in never.items():
            names = [r.rsplit(" (", 1)[0] for r in rows]
            result.add("never-gets-grad", sev, names[0] if len(names) == 1 else common_path(names),
                       f"{cut(rows, ', ', 6)} {'is' if len(rows) == 1 else 'are'} in the optimizer but never had a gradient "
                       "at a read step, nor a non-zero one at any step", "it does not reach the loss (unused, detached, or frozen; or its module was "
                       "replaced after the optimizer was built, as a classifier reset)" if sev == "warning" else
                       "frozen (requires_grad=False): in the optimizer, it is never updated",
                       members=names if len(names) > 1 else None)
        if frozen:
            result.add("never-changes", "info", frozen[0] if len(frozen) == 1 else "",
                       f"{compact(frozen)} never changed over {_its_steps(t, engine)}: "
                       f"{'its' if len(frozen) == 1 else 'their'} param group's learning rate was 0 at every read step",
                       "frozen on purpose, as a backbone given lr 0; if not, the schedule or the group's lr")
    _idle(result, engine, owners)
    _remade(result, engine)
    _models_remade(result, engine)
    _unstepped_schedulers(result, engine)
    _clock_note(result, engine)
    _handover_notes(result, engine)
    _unwatched_note(result, engine)
    _cleared(result, engine)
    _clipped_late(result, engine)
    _reloaded_own(result, engine)
    carried = engine.checks["carried"]
    if carried and not engine.opts.accumulate:
        # looked at after some steps only (stats.Track._looks_after): "every step" overstated a loop that zeroes
        # every 10th step (a sweep)
        more = f" and {len(carried) - 5} more" if len(carried) > 5 else ""
        where, whose = _carriers(engine)
        # the steps looked after of the optimizers that carried (another's, after the count passed to it, are not
        # theirs to be counted against)
        by, looked = engine.checks.get("carried_by", {}), engine.checks.get("carry_looked", {})
        steps = set().union(*(looked.get(k, set()) for k in by)) or engine.checks.get("carry_steps", carried)
        result.add("grad-carried-over", "error", where, f"gradients from the previous step{whose} were still there at "
                   f"the next backward after {len(carried)} of the {len(steps)} steps looked at ({', '.join(map(str, carried[:5]))}"
                   f"{more}): they add up across steps",
                   "call optimizer.zero_grad() once per step (or, if this is on purpose, pass accumulate=True; "
                   "--accumulate on the command line)")
    elif not engine.opts.accumulate:
        _crossed(result, engine)
    elif engine.checks.get("carry_steps") and not carried:   # declared, yet cleared every time (a sweep: the flag a user doing
        looked = len(engine.checks["carry_steps"])   # micro-batch accumulation passes hid their missing zero_grad)
        result.add("accumulate-unneeded", "info", "", f"accumulate was given, yet at each of the {looked} steps "
                   "looked at the gradients were cleared before the next backward: accumulation over micro-batches "
                   "that calls zero_grad() after each optimizer step does not need it, and without it a missing "
                   "zero_grad() is an error (grad-carried-over)", "drop accumulate unless the gradients are meant to "
                   "carry over optimizer steps")


def _cleared(result: Result, engine) -> None:
    """grad-cleared-before-step (warning): at most of the steps looked at, several backward calls before the step,
    with no other optimizer's step between and the weights unmoved, the gradients were cleared before each
    (stats.Track._cleared): the step applied the last micro-batch's gradient alone (zero_grad inside the accumulation
    loop: a sweep's run ended 3x worse, and watch passed it)."""
    looks = engine.checks.get("carry_looked", {})
    # a step that took a non-finite loss: the loop dropped that batch's gradients (non-finite-loss-dropped), not
    # micro-batches' (a review: a loop dropping 45% of its batches was said to clear inside its micro-batch loop)
    bad = {s for s, v in zip(engine.series.get("step", []), engine.series["loss"]) if v is not None and not math.isfinite(v)}
    for key, (t, hits) in engine.checks.get("cleared", {}).items():
        hits = [h for h in hits if h[0] not in bad]
        # at most of the steps looked at: a loop that skips a bad batch now and then (zero_grad, no step) clears one
        # backward's gradient at those steps alone (a review: "3 of the 3 steps" with several backwards)
        looked = looks.get(key, set())
        if len(hits) < 2 or 2 * len(hits) <= len(looked):
            continue
        steps = [s for s, _ in hits]
        most = max(b for _, b in hits)
        label = engine.doubles.label(id(t.opt), t.kind) if not t.released else t.kind
        whose = f" of {label} (over {t.names[0]}{' and more' if len(t.names) > 1 else ''})" if len(engine.tracks) > 1 \
            else ""
        result.add("grad-cleared-before-step", "warning", "",
                   f"at {len(steps)} of the {len(looked)} steps looked at, each with several backward calls before it "
                   f"(steps {', '.join(map(str, steps[:5]))}{' …' if len(steps) > 5 else ''}), the gradients{whose} were "
                   f"cleared before each backward call (up to {most} backward calls between two steps, no optimizer "
                   "step between them): the step applied the last call's gradient alone, and the earlier ones were "
                   "lost, unless they only measured something (a saliency map, per-task gradients)",
                   "call optimizer.zero_grad() once per optimizer step, after step(), not inside the loop over "
                   "micro-batches; if the earlier backward calls only measured something, this is as intended")


def _clipped_late(result: Result, engine) -> None:
    """clip-after-step (warning): the loop clipped the gradients its optimizer had already applied (clip.ClipNorms._late:
    the same tensors, unwritten since the step), so no step ever took a clipped gradient."""
    late = engine.clips.late
    if not late:
        return
    fns = sorted({fn for _, fn in late})
    result.add("clip-after-step", "warning", "",
               f"{' and '.join(fns)} ran after optimizer.step(), on the gradients that step had already applied "
               f"({len(late)} time(s), the first after {_step_words(engine, late[0][0])}): the step took them "
               "unclipped and the next backward replaces them, so the clipping never acts",
               "clip between loss.backward() and optimizer.step() (with a GradScaler, after scaler.unscale_(optimizer))")


def _reloaded_own(result: Result, engine) -> None:
    """reload-restores-nothing (warning): Engine.loading (reload.py)."""
    at = engine.checks.get("reload_own")
    if not at:
        return
    result.add("reload-restores-nothing", "warning", "",
               f"load_state_dict was given the model's own live tensors ({len(at)} time(s), the first after "
               f"{_step_words(engine, at[0])}): a state_dict() kept without a copy follows the weights as they train, "
               "so loading it restores nothing, and the weights it was meant to keep (the best so far) are gone",
               "keep a copy: copy.deepcopy(model.state_dict()), or {k: v.detach().clone() for k, v in "
               "model.state_dict().items()}")


def _step_words(engine, step: int) -> str:
    """'step 33', with its epoch where the loop told it (a sweep: set_epoch was called, no finding said one)."""
    epoch = engine.epoch_at(step)
    return f"step {step}" + (f", epoch {epoch}" if epoch is not None else "")


def _carriers(engine) -> tuple[str, str]:
    """Where grad-carried-over points, and which optimizer it names, where the run has several (a sweep: an
    embedding's own Adam never zeroed, beside a head's that was, was named by neither)."""
    live = [t for t in engine.tracks.values() if not t.retired]
    by = list(engine.checks.get("carried_by", {}).values())
    if len(live) < 2 or not by:
        return "", ""
    said = [f"{engine.doubles.label(id(t.opt), t.kind) if not t.released else t.kind} over {t.names[0]}"
            + (" and more" if len(t.names) > 1 else "") for t in by]
    return by[0].names[0], f" ({'; '.join(said)})"


def _crossed(result: Result, engine) -> None:
    """An optimizer whose step applied a gradient that a backward made before another optimizer's step (stats.Track
    disarm), which its own backward's gradient pulled against: a loss another optimizer stepped on trained these
    parameters the other way (a GAN's discriminator loss on fakes not detached, both zero_grad calls at the loop's
    top). A head accumulating one loss over its body's steps, or a trunk two losses train, pulls the same way."""
    for t, step, cos in engine.checks["crossed"].values():
        label = engine.doubles.label(id(t.opt), t.kind) if not t.released else t.kind
        where = t.names[0].split(".", 1)[0] if len(engine.models_seen) > 1 else ""
        over = where or (t.names[0] + (" and more" if len(t.names) > 1 else ""))
        result.add("grad-from-other-loss", "warning", where,
                   f"{label} (over {over}) applied at step {step} a gradient made of two that pull apart (cosine "
                   f"{cos:.2f}): one from a backward before another optimizer stepped, never cleared, and its own "
                   "backward's after it: the loss that other optimizer stepped on trained these parameters the other way",
                   "in a GAN, the discriminator's loss on fakes not detached reaches the generator: use "
                   "fake.detach() there, or call the generator optimizer's zero_grad() right before its own backward")


def _optimizer_where(t, k: int) -> str:
    """Where a finding on one of several optimizers is: the path its parameters share (a sweep's GAN: "optimizer 1"
    named nothing the user sees, where every parameter was netG's), else its place in the run's order."""
    return common_path(list(t.names)) or f"optimizer {k}"


def _starved(result: Result, engine, t, judged: list, owners: dict, where: str) -> bool:
    """None of the trainable parameters an optimizer holds got a gradient at any read it stepped at: it was built over
    other tensors than the backward reaches (before `.to()` made new ones, over a model made again). One finding, not
    one per parameter named by index; an error when no optimizer of the run got any gradient (nothing trained)."""
    mine = [i for i, p in enumerate(t.params) if p.requires_grad and owners[param_key(p)] is t]
    if not mine or any(t.seen_grad[i] or t.grad_max[i] > 0 or t.sampled <= t.joined[i] for i in mine):
        return False
    trained = any(o is not t and any(o.seen_grad) for o in judged)
    why, hint = _starved_why(engine, t)
    result.add("never-gets-grad", "warning" if trained else "error", where,
               f"none of the {len(mine)} trainable parameters {'this optimizer' if where else 'the optimizer'} holds "
               f"got a gradient at any read step of its {t.stepped} steps"
               + ("" if trained else ": nothing this run stepped was trained") + why, hint)
    return True


FITTED = 1e-4          # the loss at most this share of its first value: what it fits is fitted
STOPPED_SHARE = 0.25   # of an optimizer's steps, the last ones taken with no gradient at all (and at least 20)


def _stopped(result: Result, engine, t, where: str, judged: list) -> None:
    """An optimizer whose parameters had gradients, then none for the rest of the run while it kept stepping (a sweep:
    a model widened mid-run, Net2Net-style, with the optimizer left on the old one: 150 steps of nothing, the new model
    never trained). Gradients there and exactly 0 are _stopped_at_zero's; none at all: a warning when no model holding
    them was called since (replaced), info when one still runs without reaching them (a review: a task head the
    curriculum stopped using, stepped on harmlessly) or when they were frozen since."""
    if t.last_fed is None or t.unfed_after < max(20, STOPPED_SHARE * t.stepped):
        return
    live = [p for p in t.params if not isinstance(p, Released)]
    frozen = bool(live) and not any(p.requires_grad for p in live)
    if not frozen and any(p.grad is not None for p in live):   # present and exactly 0 (the norms tell no more)
        _stopped_at_zero(result, engine, t, where, judged)
        return
    roots = t.roots or (set(engine.roots) if engine.explicit_models else set())   # Watch(model, opt): the given ones
    running = any(engine.called_at.get(r, -1) >= t.last_fed for r in roots)
    said = (f"{'this optimizer' if where else 'the optimizer'} stepped {t.unfed_after} more times after step "
            f"{t.last_fed} with no gradient on any of its {len(t.params)} parameter tensors, which had them before")
    if frozen:
        result.add("gradients-stopped", "info", where, said + ": they were frozen (requires_grad=False)",
                   "nothing to do if freezing them was the plan (or take them out of the optimizer)")
    elif running:
        result.add("gradients-stopped", "info", where, said + ": the model holding them still runs, and the loss no "
                   "longer reaches them (a branch or task the loop stopped using?)",
                   "nothing to do if that part is done on purpose; else look for what cut it off since that step")
    else:
        result.add("gradients-stopped", "warning", where, said + ": no model holding them was called since (replaced?)",
                   "a model made again (or replaced) after its optimizer was built: build the optimizer over the new "
                   "model's parameters")


def _stopped_at_zero(result: Result, engine, t, where: str, judged: list) -> None:
    """Gradients there and exactly 0 since a step: a warning while the run's loss stays (every unit dead: the bugs
    benchmark's so_48251943, a dead ReLU output); info when the loss is fitted (0, or at most FITTED of its start: a
    clipped softmax met rounds its gradient to 0, so_59325381) or another optimizer still trains (the loss is the
    run's, not this optimizer's part: a review's met hinge head beside a regression head)."""
    who = "this optimizer" if where else "the optimizer"
    since = f"every gradient {who} applies has been exactly 0 since step {t.last_fed} ({t.unfed_after} steps)"
    losses = [v for v in engine.series["loss"][-10:] if v is not None]
    start = next((v for v in engine.series["loss"] if v is not None and math.isfinite(v)), None)
    fitted = bool(losses) and (all(v == 0 for v in losses) or (
        start is not None and start > 0 and max(losses) <= FITTED * start))
    if any(o is not t and o.last_fed is not None and o.last_fed > t.last_fed for o in judged):
        result.add("gradients-stopped", "info", where, since + ", while another optimizer's parameters still get "
                   "gradients: its part is fitted, or its units dead",
                   "nothing to do if its part is done (a margin met); else look for dead units (gradflow)")
    elif fitted:
        result.add("gradients-stopped", "info", where, since + f", with the loss at {losses[-1]:.3g}"
                   + (f" (from {start:.3g})" if start else "") + ": nothing is left to fit (its gradients round to 0)",
                   "nothing to do if the fit is what you wanted")
    elif losses and all(v > 0 and math.isfinite(v) for v in losses):
        result.add("gradients-stopped", "warning", where, since + f" while the loss is still {losses[-1]:.4g}: nothing "
                   "it holds has trained since", "every unit dead or saturated (see dead-units, gradflow), or an output "
                   "the loss reads through a constant (a clamp, a step function, argmax)")


def _starved_why(engine, t) -> tuple[str, str]:
    """Why an optimizer's parameters never had a gradient at its steps, from what the run did (a sweep: zero_grad()
    between backward() and step(), and a loss on a detached output, were both told to rebuild the optimizer)."""
    if not (t.roots or engine.holds_any(t.params)):
        return ("; no model called in the run holds them", "build the optimizer from the model you train, after it "
                "is final: after .to() when it makes new parameters, and not over a model made again since")
    if not engine.backwards:   # (a sweep: Lightning skips backward for a training_step that returns None, and steps)
        return ("; no loss.backward() ran in the whole run",
                "call loss.backward() before each optimizer.step(); under Lightning, return the loss from "
                "training_step (a None return skips the backward, not the step)")
    gave = t.backward_gave
    # zero_grad(), step(), backward() (a sweep: told to move zero_grad(), which came first already) gives the same
    # calls as a first step before the loop, then backward(), zero_grad(), step() (a review): both are said
    if gave and t.first_before_backward:
        return ("; a backward gave them gradients, and they were gone by the step: its first step came before any "
                "backward", "call optimizer.step() after loss.backward() with no zero_grad() between them: a step "
                "before the backward, or a zero_grad() between backward() and step(), clears what each backward gave")
    if gave:
        return ("; a backward gave them gradients, and they were gone by the step",
                "call optimizer.zero_grad() before loss.backward() (or at the loop's start), not between backward() "
                "and step()")
    if gave is False:
        return ("; the model that holds them was called, but a backward left them no gradient",
                "compute the loss from the model's output as it comes back: not through .detach(), .item(), "
                ".numpy(), torch.no_grad() or a new tensor made from its values")
    return ("", "build the optimizer from the model you train, after it is final: after .to() when it makes new "
                "parameters, and not over a model made again since")


def _unstepped_schedulers(result: Result, engine) -> None:
    """A scheduler stepped on an optimizer that never stepped (schedulers.unstepped)."""
    trains = [t.opt for t in engine.tracks.values() if not t.retired and t.opt is not None]
    for kind, opt, calls, first in engine.schedulers.unstepped():
        theirs = f": the optimizer that trains ({type(trains[0]).__name__}) keeps its own rate" if trains else ""
        result.add("scheduler-idle-optimizer", "warning", "", f"a learning-rate scheduler ({kind}) was stepped at "
                   f"{calls} of the run's steps (from step {first}) on an optimizer ({opt}) that never stepped: the learning rate it schedules trains nothing{theirs}",
                   "build the scheduler on the optimizer the loop steps: Scheduler(optimizer, ...) after that "
                   "optimizer is made (a leftover or re-made optimizer keeps the old one's scheduler)")


def _remade(result: Result, engine) -> None:
    """An optimizer made again over the same parameters after each single step, for most of the run, while it keeps
    state (Adam's moments, momentum): that state starts over at every step (a sweep: Adam made inside the loop, the
    report said one optimizer and pass). An optimizer made again each epoch takes many steps each time."""
    live = [t.opt for t in engine.tracks.values() if not t.retired and t.opt is not None]
    stateful = [o for o in live if any(len(s) for s in o.state.values())]
    if engine.remade >= 5 and engine.remade >= engine.step // 2 and stateful:
        result.add("optimizer-remade", "warning", "", f"the optimizer ({type(stateful[0]).__name__}) was made again over "
                   f"the same parameters after a single step {engine.remade} times in {engine.step} steps: its state "
                   "(moment estimates, momentum) starts over at every step",
                   "build the optimizer once, before the loop")


def _models_remade(result: Result, engine) -> None:
    """A new model made at each step, for most of the run, each stepped once and let go (the model built inside the
    loop): each starts from new weights, so no training builds up. Not said where a model trained through the run
    beside them (MAML's meta-model, a GAN's generator beside a discriminator made anew), where the models start from
    the same weights or from nearly the last one's (a copy of one model per episode, a state-dict round trip: a
    review), or where the loss fell beyond its noise anyway."""
    shapes, starts = [s for s, _ in engine.one_off_starts], [f for _, f in engine.one_off_starts]
    if engine.one_offs < 5 or engine.one_offs < engine.step // 2 or len(starts) < 2 \
            or any(s != shapes[0] for s in shapes):   # other architectures: a search, one step a candidate
        return
    if any(t.stepped >= max(5, engine.step // 2) for t in engine.tracks.values()):
        return
    if not all(_apart(a, b) for a, b in zip(starts, starts[1:])):
        return
    losses = [v for v in engine.series["loss"] if v is not None and math.isfinite(v)]
    w = window(len(losses))
    if len(losses) < 2 * w or _fell(losses[:w], losses[-w:]):
        return
    first, last = statistics.median(losses[:w]), statistics.median(losses[-w:])
    result.add("model-remade", "warning", "", f"{len(engine.models_seen)} models were made over the run's "
               f"{engine.step} steps, each from new weights, stepped once and let go: no training builds up, and the "
               f"loss shows no fall beyond its noise ({first:.4g} → {last:.4g}, medians of the first and last {w} "
               "steps)", "build the model (and its optimizer) once, before the loop")


APART = 0.05   # model-remade: new weights move some parameter's sum by this share of the whole model's norm at least


def _apart(a, b) -> bool:
    """Two first-step fingerprints (norms, sums, half sums per parameter; stats.Track._fingerprint) of models made
    one after the other: drawn anew (independent draws move a weight's sum by about its norm), not a copy or one step
    on from the last (a move a learning rate's size). Against the whole model's norm: a bias at 0 has no norm of
    its own to measure a step against (a review: a LayerNorm's bias made a state-dict round trip "new weights")."""
    import torch

    whole = torch.maximum(a[0].norm(), b[0].norm()).clamp_min(1e-12)
    return bool(((a[1:] - b[1:]).abs() / whole).max() > APART)


def _trains_some(t) -> bool:
    """Some of the optimizer's groups have a rate above 0: the ones at 0 are frozen on purpose. An optimizer whose
    every rate is 0 trains nothing, and its parameters stay warnings."""
    return bool(t.sampled) and any(m > 0 for m in t.lr_max)


def _idle(result: Result, engine, owners: dict) -> None:
    """An optimizer that stepped and then stopped, still alive, while a backward went on reaching its parameters at
    IDLE_READS reads or more (Track.idle_read), for a stretch more than twice the longest it ever left before or
    between its steps (one stepping every 100 steps, or only in every other epoch, on purpose is not idle): the
    gradients are made and nothing applies them. A parameter another optimizer stepped later is that one's."""
    for t in engine.tracks.values():
        idle = engine.step - t.last_step
        if t.released or t.idle_reads < IDLE_READS or idle <= 2 * max(t.gap_max, 1):
            continue
        names = [t.names[i] for i, p in enumerate(t.params) if owners[param_key(p)] is t and id(p) in t.reached]
        if not names:
            continue
        label = engine.doubles.label(id(t.opt), t.kind)   # as double-update names it (a review: the two differed)
        listed = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        times = "once" if t.stepped == 1 else f"{t.stepped} times"
        result.add("optimizer-idle", "warning", names[0], f"{label} stepped {times} up to step {t.last_step}, "
                   f"then not in the last {idle} steps, while its parameters ({listed}) kept getting new gradients "
                   f"(at {t.idle_reads} read steps): nothing applies them",
                   "call its step() where the loop stopped calling it; if its step is conditional on purpose (a GAN's "
                   "discriminator stepped only while it is weak), it has not been taken since; to keep them as they "
                   "are, freeze them (requires_grad_(False)), which saves their backward too")


def _handover_notes(result: Result, engine) -> None:
    """The count passed from a clock that stopped while kept alive (engine._stopped): said, so that a run whose
    counted optimizer changed (a student after its teacher, a critic after a long burst) reads as such."""
    for step, new, old, before in engine.stop_handovers:
        result.notes.append(f"from step {step} the steps counted are {new}'s: {old}, counted before, stopped while "
                            f"kept alive ({before} steps of the other after its last)")


def _unwatched_note(result: Result, engine) -> None:
    """Optimizers given: one not given that stepped a given model's parameters more than 2 x every times after the
    given ones' last step (a second stage's) is not watched, and said (a review: a NaN in its steps went unseen)."""
    for name, steps in engine.unwatched.values():
        if steps > 2 * engine.opts.every:
            result.notes.append(f"{name}, not given to watch, stepped {steps} times after the last step of the "
                                "optimizer given: those steps were not watched (give it too, or give no optimizer "
                                "and every one that trains the model is watched)")


def _clock_note(result: Result, engine) -> None:
    """The run's steps are the clock's (the first optimizer of a model to step). One that stopped while kept alive
    is not replaced (engine._choose_clock): the steps another optimizer of a model took after its last, more than
    2 × every and CLOCK_STOPPED times the most it took between two of the clock's, are said, not counted."""
    for t in engine.tracks.values():
        if t.roots and not t.released and t.since_clock > max(2 * engine.opts.every, CLOCK_STOPPED * t.peak_since):
            result.notes.append(f"{t.kind} took {t.since_clock} steps since the last step of the optimizer whose steps are "
                                f"counted (step {engine.step}): they are not in the count (that optimizer stopped "
                                "while kept alive; pass the one that trains to watch(model, optimizer) to count its steps)")


def _doubles(result: Result, engine) -> None:
    """One gradient applied twice (double.py): by two optimizers that hold the same parameters, or by one
    optimizer's step() called twice."""
    for step, name in engine.doubles.repeated.values():
        result.add("double-step", "warning", name, f"optimizer {name}: step() ran again on the gradients its last step "
                   f"applied (first seen at step {step}): every update is applied twice",
                   "call step() once per backward (or zero_grad() and backward() before the second step)")
    pairs: dict = {}
    for pid, (step, first, second) in engine.doubles.found.items():
        pairs.setdefault((first, second), []).append((step, _param_name(engine, pid)))
    for (first, second), found in pairs.items():
        names = [n for _, n in found]
        listed = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        result.add("double-update", "warning", names[0], f"{listed}: in two optimizers ({first}, then {second}), and "
                   f"both applied the same gradient to {'it' if len(names) == 1 else 'them'} (first seen at step "
                   f"{min(s for s, _ in found)}): each update is applied twice", "give each parameter to one optimizer "
                   "(leave a head with its own optimizer out of the model's), or drop the second optimizer")


def _param_name(engine, pid: int) -> str:
    for t in engine.tracks.values():
        i = t.ids.get(pid) if not t.released else next((k for k, p in enumerate(t.params) if param_key(p) == pid), None)
        if i is not None:
            return t.names[i]
    return "a parameter"


def _loss_ignores(track, engine) -> set[int]:
    """The parameters of one optimizer when every one that got a gradient got exactly zero at every step
    (the per-step maxima cover all steps, not only reads): the loss is constant in the parameters. A
    parameter the model cancels while the others train (a bias before BatchNorm) is not this; neither is
    a non-finite gradient (its norm is left out of the maxima)."""
    got = {i for i, p in enumerate(track.params) if track.seen_grad[i] and p.requires_grad}
    # no read, no maxima: a watch stopped by an internal error before its first read said "every gradient exactly 0"
    if not got or engine.step < 1 or engine.reads == 0 or engine.events or track.first_bad is not None:
        return set()
    return got if all(track.grad_max[i] == 0 for i in got) else set()


def _negligible(track, i: int) -> bool:
    """A gradient at most 1e-6 of the parameter's norm at every step: rounding noise of a gradient
    the model cancels (a bias before BatchNorm gets ~1e-9), too small to move float32 weights."""
    norm = track.weight_norm[i] if track.weight_norm else None
    if norm is None:   # never read (a student's steps counted from a stopped clock at the end): its value now, once
        norm = _live_norm(track.params[i])
    return track.grad_max[i] == 0 or (norm is not None and math.isfinite(norm) and track.grad_max[i] <= 1e-6 * norm)


def _live_norm(p) -> float | None:
    """A parameter's norm as it is now (None for a released one's stand-in, or one that cannot be read)."""
    import torch

    if not isinstance(p, torch.Tensor):
        return None
    try:
        with torch.no_grad():
            return float(p.detach().float().norm())
    except Exception:   # noqa: BLE001 - a meta or freed tensor: not known
        return None


def _parts_fed(engine) -> dict:
    """Each part put in eval (its top module's name) -> whether a trained parameter feeds any module of it that a
    sampled forward asked (None: none asked). One verdict for a part's weights in no optimizer: a transformer
    layer's attention, whose projections are no leaf called, shares its layer's (a review)."""
    out: dict = {}
    for name, fed in engine.checks["eval_fed"].items():
        for top in set(engine.checks["eval_top"].values()):
            if name == top or name.startswith(top + "."):
                out[top] = bool(out.get(top)) or fed
    return out


def _modes(result: Result, engine) -> None:
    steps = engine.checks["eval_steps"]
    inert = engine.checks.get("mode_inert")
    if steps and inert and inert[1] and set(engine.checks.get("eval_models", {})) <= {inert[0]}:
        result.add("trained-in-eval-mode", "info", "", f"{len(steps)} of {engine.step} steps trained on a forward made "
                   f"in eval mode (first: step {steps[0]}), which changes nothing in this model: it holds no dropout "
                   "or BatchNorm, and its last training batch gives the same output in train and in eval mode")
    elif steps:
        several = len(engine.roots) > 1   # named only where there are several models, as their parameters are
        which = [engine.root_prefix(engine.roots[r]).rstrip(".") for r in engine.checks.get("eval_models", {})
                 if several and r in engine.roots]
        result.add("trained-in-eval-mode", "warning", ", ".join(which), f"{len(steps)} of {engine.step} steps trained "
                   f"on a forward made in eval mode (first: {_step_words(engine, steps[0])})" + (f"; the model(s) in eval mode: "
                   f"{', '.join(which)}" if which else ""), "call model.train() after evaluating")
    fed, region = engine.checks.get("eval_fed", {}), engine.checks.get("eval_region", {})
    unfed = engine.checks.get("eval_unfed", {})
    # in eval where nothing trained feeds it (a sampled forward's graph, or calls seen whose inputs carry no gradient)
    # and its own weights do not train, inside a part put in eval whose weights none train: its mode changes no
    # gradient that trains (a linear probe's body, a frozen encoder, a teacher in eval): a frozen layer
    apart = {n: s for n, s in engine.checks["eval_modules"].items()
             if (fed.get(n) is False or (fed.get(n) is None and unfed.get(n))) and region.get(n)}
    # kept in eval by the model's own train() (modes.kept_in_eval): a design, judged below as a frozen one is
    kept_set = engine.checks.get("eval_kept", set())
    by_train = [n for n in engine.checks["eval_modules"] if n in kept_set and n not in apart]
    left = engine.checks.get("eval_left", {})
    for name, step in engine.checks["eval_modules"].items():
        if name in apart or name in by_train:
            continue
        until = f"; back in train mode at the read of step {left[name]}" if name in left else ""
        result.add("module-in-eval-mode", "warning", name, f"{name} (dropout/BatchNorm) was in eval mode while the "
                   f"model trained ({_step_words(engine, step)}{until})", "something called .eval() on this submodule; "
                   "call model.train()")
    warned = set(engine.checks["eval_modules"]) - set(apart) - set(by_train)   # frozen first, unfrozen later in eval
    kept = [n for n in [*engine.checks.get("eval_frozen", {}), *apart] if n not in warned and n not in by_train]
    fresh = [n for n in [*kept, *by_train] if engine.never_normalised(n)]
    for name in fresh:   # a review: a BatchNorm frozen as built normalises nothing, from scratch that is a mistake
        step = engine.checks["eval_frozen"].get(name, apart.get(name, engine.checks["eval_modules"].get(name)))
        result.add("module-in-eval-mode", "warning", name, f"{name} (BatchNorm) was in eval mode "
                   + ("" if name in by_train else "with its weights not trained ") + f"while the model trained (step "
                   f"{step}), and its running statistics never saw a batch: it normalises with mean 0 and variance 1",
                   "load the pretrained statistics it was frozen for, or let it train (model.train())")
    by_train = [n for n in by_train if n not in fresh]
    if by_train:
        result.add("module-in-eval-mode", "info", common_path(by_train) or by_train[0],
                   f"{len(by_train)} dropout/BatchNorm module(s) ({cut(by_train, ', ', 4)}) stayed in eval mode while "
                   "the model trained, and the model's own train() keeps them there: a design (BatchNorm statistics "
                   "frozen, as detection backbones' norm_eval), not a .eval() left over",
                   members=by_train if len(by_train) > 1 else None)
    frozen = [n for n in kept if n not in fresh]
    unfrozen = [n for n in frozen if n in left]   # frozen for the first steps, trained after (a fine-tuning schedule)
    frozen = [n for n in frozen if n not in left]
    if frozen:   # BatchNorm frozen for fine-tuning: eval mode and requires_grad=False together, on purpose
        result.add("module-in-eval-mode", "info", common_path(frozen) or frozen[0],
                   f"{len(frozen)} BatchNorm/dropout module(s) ({cut(frozen, ', ', 4)}) stayed in eval mode while "
                   "the model trained, with their own weights not trained (frozen, or in no optimizer)"
                   + (", in a part put in eval whose weights do not train either" if apart else "") + ": a frozen part, "
                   "as in fine-tuning or a linear probe", members=frozen if len(frozen) > 1 else None)
    if unfrozen:
        result.add("module-in-eval-mode", "info", common_path(unfrozen) or unfrozen[0],
                   f"{len(unfrozen)} BatchNorm/dropout module(s) ({cut(unfrozen, ', ', 4)}) were seen in eval mode, "
                   f"with their own weights not trained, at the reads from step {min(kept_at(engine, n) for n in unfrozen)}"
                   f", and back in train mode from the read of step {max(left[n] for n in unfrozen)}: a part frozen for "
                   "the first steps, then unfrozen", members=unfrozen if len(unfrozen) > 1 else None)


def kept_at(engine, name: str) -> int:
    """The read step a module was first seen in eval mode (frozen, or not)."""
    return engine.checks["eval_frozen"].get(name, engine.checks["eval_modules"].get(name, 0))


def _eval_unreached(result: Result, engine) -> None:
    """A model put in eval whose dropout/BatchNorm stayed in train mode (engine._eval_reaches)."""
    for r, (step, acting) in engine.checks["eval_unreached"].items():
        root = engine.roots.get(r)
        prefix = engine.root_prefix(root) if root is not None else ""
        names = [prefix + n for n in acting]
        result.add("eval-not-reached", "warning", prefix.rstrip("."),
                   f"the model was put in eval mode (after {_step_words(engine, step)}: a validation pass?) but "
                   f"{len(names)} of its dropout/BatchNorm module(s) ({cut(names, ', ', 4)}) stayed in train mode: "
                   "dropout stays on in its outputs and BatchNorm normalises with each batch and learns its statistics",
                   "a train()/eval() override must call super().train(mode), which sets every submodule's mode",
                   members=names if len(names) > 1 else None)


def _val_in_train(result: Result, engine) -> None:
    """Passes of a trained model under no_grad in train mode between steps, now and then (engine._train_mode_pass):
    a validation that forgot model.eval(). At more than half the steps (a GAN's critic steps, MixMatch's guesses): no
    finding. A warning where a loop of such calls (two or more between two steps) ran through a BatchNorm: it took
    those batches in; info otherwise: dropout alone only made the numbers noisy (Monte-Carlo dropout does it on
    purpose), and a single call (a GAN's sample of images, in train mode as the DCGAN tutorial takes it) is said."""
    for r, f in engine.checks["val_in_train"].items():
        half = max(1, engine.step // 2)
        loops = 0 < f["multi_steps"] <= half   # loops of such calls now and then: a validation, whatever else
        if not loops and (f.get("each_step") or f["steps"] > half):   # (counted no further once at most steps)
            continue
        root = engine.roots.get(r)
        prefix = engine.root_prefix(root) if root is not None else ""
        drop, bns = [prefix + n for n in f["dropout"]], [prefix + n for n in f["bn"]]
        acting = ([f"its dropout ({cut(drop, ', ', 3)}) drew new noise into every output"] if drop else []) + (
            [f"its BatchNorm ({cut(bns, ', ', 3)}) normalised with each batch and took it into its running "
             "statistics"] if bns else [])
        calls = "several forwards" if loops else "a forward"
        at = f["multi_steps"] if loops else f["steps"]
        result.add("evaluated-in-train-mode", "warning" if bns and loops else "info", prefix.rstrip("."),
                   f"the model ran {calls} under no_grad in train mode between two steps (after "
                   f"{_step_words(engine, f['multi_from'] if loops else f['step'])}, at {at} of {engine.step} steps: "
                   "a validation pass?): "
                   + "; ".join(acting) + ": what those passes measured is not what the model computes in eval mode",
                   "call model.eval() before validating and model.train() after (Monte-Carlo dropout on purpose: "
                   "ignore this)", members=(drop + bns) if len(drop + bns) > 1 else None)


def _dropout_rate(result: Result, engine) -> None:
    """Dropout modules of a trained model that drop most of their input (core/dropout_rate.py, as doctor asks it;
    looked at once a model, at a read in train mode)."""
    from ...core.dropout_rate import CODE, said

    found = [f for got in engine.checks["dropout_high"].values() for f in got]   # one finding: a model per fold is
    if found:                                                                       # one mistake (a review)
        found, models = _one_per_remade(found)
        message, hint = said(found)
        if models > 1:
            message += f" (each in {models} models made one after another)"
        result.add(CODE, "warning", found[0][0] if len(found) == 1 else common_path([n for n, _ in found]),
                   message, hint, members=[n for n, _ in found] if len(found) > 1 else None)


def _one_per_remade(found: list) -> tuple[list, int]:
    """(name, p) findings of models made anew (labelled `model#0`, `model#1`, … by names.label), one per module of
    the model: a review saw "18 dropout modules (head.1, head#2.1, …)" for one module of a model made each step.
    Also: how many models they came from, where more than one."""
    import re

    kept: dict[str, float] = {}
    roots: dict[str, set] = {}
    for name, p in found:
        root, _, rest = name.partition(".")
        key = re.sub(r"#\d+$", "", root) + ("." + rest if rest else "")
        kept[key] = max(p, kept.get(key, p))
        roots.setdefault(key, set()).add(root)
    models = max(len(r) for r in roots.values())
    return ([(k, p) for k, p in kept.items()], models) if models > 1 else (found, 1)


def _bn_momentum(result: Result, engine) -> None:
    """The trained models' BatchNorms that ran in train mode and whose running statistics keep mostly the last
    batch, or never moved (core/bn_momentum.py, as doctor asks it; engine._bn_kept at each read). A sweep: momentum
    1.0 ran unsaid, eval accuracy 0.68 against 0.96 with torch's default."""
    from ...core.bn_momentum import CODE

    for kept_list in engine.checks["bn_kept"].values():
        for kept in kept_list:
            where = kept.names[0] if len(kept.names) == 1 else ""
            result.add(CODE, "warning", where, kept.message, kept.hint, members=kept.members)


def _frozen_in_train(result: Result, engine) -> None:
    """A frozen model (a teacher) run under no_grad in train mode while another trained (frozen.py)."""
    found = engine.frozen_in_train_mode()
    names = [f["name"] for f in found]
    for i, f in enumerate(found):
        if names.count(f["name"]) > 1:   # two modules bound in turn to one loop variable (a review: `b`, said twice)
            f["name"] = f"{f['name']}#{names[:i + 1].count(f['name']) - 1}"
        bn = "; ".join(f"{n or '(root)'}: {b - a} more batches counted" for n, a, b in f["bns"][:3]) + (
            f" (+{len(f['bns']) - 3})" if len(f["bns"]) > 3 else "")
        said = [f"its dropout ({cut(f['dropout'], ', ', 3)}) draws new noise into every output it gives"] \
            if f["dropout"] else []
        said += [f"its BatchNorm running statistics followed the batches ({bn})"] if f["bns"] else []
        # a copy of the trained model that never changed: a reference model left in train mode, or an EMA or target
        # network whose update comes after these steps (diffusers' update_after_step): info, the fact said (a review)
        result.add("frozen-in-train-mode", "info" if f.get("copy") else "warning", f["name"],
                   f"{f['name']} ran in train mode without training (under no_grad, its weights frozen, or none of them ever given "
                   "a gradient) while "
                   f"the model trained (first at step {f['step'] + 1}), "
                   + ("as a copy of the trained model made before its first step that never changed in these "
                      f"{engine.step} steps (a reference model, or an EMA or target network whose update comes later?): "
                      if f.get("copy") else "with weights no optimizer holds that never changed (a frozen model, a "
                      "teacher?): ") + ", and ".join(said),
                   f"call {f['name']}.eval() once after building it: its outputs are then deterministic and its "
                   "statistics stay those it was trained with")


def _probabilities(result: Result, engine) -> None:
    """A class loss module that got probabilities (engine._look_at_loss_input): a softmax before CrossEntropyLoss,
    which applies log_softmax itself, so the loss cannot fall below log(1 + (C − 1)/e); NLLLoss wants their log."""
    _broadcast(result, engine)
    _wrong_dim(result, engine)
    _sigmoid_into_logits(result, engine)
    _dropout_into_loss(result, engine)
    _labels_are_inputs(result, engine)
    _ctc_blank(result, engine)
    _logits_into_nll(result, engine)   # its own module's: beside another module's probabilities too (a review)
    got = engine.checks.get("probs_into_loss")
    if not got or (not got[3] and "logits_into_nll" in engine.checks):   # an NLLLoss's logits once, not twice
        return
    step, loss, classes, logits, *smoothing = got   # the module's label smoothing; unknown from a function's graph
    if logits:
        eps = smoothing[0] if smoothing else None
        if eps is not None and math.isnan(eps):   # class weights move the floor, below the unweighted one too
            bound = "squashed (its floor depends on the class weights it was given)"
        else:
            said = f" (label smoothing {eps:g})" if eps else "" if eps is not None else " (more under label smoothing)"
            bound = (f"squashed and the loss cannot fall below {probabilities_floor(classes, eps or 0.0):.4g}{said}")
        result.add("probabilities-into-loss", "warning", "", f"{loss} got probabilities at step {step} "
                   f"(every value in [0, 1], each row summing to 1 over its {classes} classes): a softmax before it. "
                   f"cross-entropy applies log_softmax itself, so the gradients are {bound}",
                   "return the logits (drop the softmax at the end of the model); apply "
                   "softmax only for predictions")
    else:
        result.add("probabilities-into-loss", "warning", "", f"{loss} got values ≥ 0 at step {step}, over {classes} "
                   "classes (probabilities, or logits): it takes log-probabilities, which are ≤ 0",
                   "apply log_softmax, not softmax, before NLLLoss (or give the logits to CrossEntropyLoss)")


def _ctc_blank(result: Result, engine) -> None:
    """ctc-blank-in-targets (warning): engine._look_at_ctc."""
    got = engine.checks.get("ctc_blank")
    if not got:
        return
    step, blank, labels, hits = got
    low = min((v for v in engine.series["loss"] if v is not None and math.isfinite(v)), default=None)
    fell = f"; the loss went as low as {low:.4g}, below the 0 no valid target can reach" if low is not None and low < 0 \
        else ""
    result.add("ctc-blank-in-targets", "warning", "",
               f"ctc_loss's targets hold its blank index {blank} at step {step} ({hits} of the {labels} label "
               f"positions): CTC reads the blank as no label at all, so a target using it is a sequence the model "
               f"cannot emit, and the loss stops being a likelihood{fell}",
               "make the blank a class no label uses (torch's default blank=0, with labels 1..C-1), or shift the labels")


def _labels_are_inputs(result: Result, engine) -> None:
    """labels-are-inputs (warning): at most of the looks, the cross-entropy's targets were the model's input ids,
    position for position (engine._look_at_labels)."""
    got, (looked, hits) = engine.checks.get("labels_inputs"), engine.checks.get("labels_looked", (0, 0))
    if not got or 2 * hits <= looked:
        return
    fell = _fell_tenfold(result.series["loss"])
    if fell is None:   # a model that masks what it sees (a PixelCNN's masked convolutions) scores each position
        return         # against the id it was given, and learns no copy: its loss stays up (a review)
    step, shape = got
    result.add("labels-are-inputs", "warning", "",
               f"the cross-entropy's targets are the ids the model looked up in an embedding "
               f"({'×'.join(map(str, shape))}), position for position, at {hits} of the {looked} steps looked at (the first, step {step}): each position is "
               f"asked for the token it is given, which the model learns to copy: the loss fell from {fell[0]:.4g} to "
               f"{fell[1]:.4g} (first and last windows' medians) with nothing learned of what comes next (labels not "
               "shifted, or a masked model's inputs left unmasked)",
               "shift them: the logits at positions 0..T-2 against the ids at 1..T-1 (logits[:, :-1] with "
               "ids[:, 1:]); a Hugging Face model given labels=input_ids shifts them itself; a masked LM replaces the "
               "scored positions in its input (the mask token). If the model is meant "
               "to reproduce its input (an autoencoder, a copy task), this is as intended")


def _fell_tenfold(losses: list) -> tuple[float, float] | None:
    """(first, last) windows' median losses where the last is a tenth of the first or less, else None."""
    values = [v for v in losses if v is not None and math.isfinite(v)]
    if len(values) < 4:
        return None
    w = max(2, min(window(len(values)), len(values) // 4))
    first, last = statistics.median(values[:w]), statistics.median(values[-w:])
    return (first, last) if first > 0 and last <= 0.1 * first else None


def _logits_into_nll(result: Result, engine) -> None:
    got = engine.checks.get("logits_into_nll")
    if got:
        from .engine import NLL_FLOOR

        step, loss, classes, mean, k = got
        over = f"{classes} classes" if k == classes else f"the {k} finite values of its {classes} classes"
        result.add("logits-into-nll", "warning", "", f"{loss} got values that are not log-probabilities at step {step}: "
                   f"a sample's row of both signs with a mean of {mean:.3g} over {over}, where log-probabilities' mean "
                   f"is at most log(1/{k}) = {math.log(1 / k):.3g} ({math.log(1 / k + NLL_FLOOR):.3g} with a floor of up "
                   f"to {NLL_FLOOR:g} added before the log) and none is above 0 (raw logits?). NLLLoss only negates the target's "
                   "value, so on logits it raises that one without bound (the loss falls below 0 and on) and the other "
                   "classes' values get no gradient",
                   "apply log_softmax over the classes before NLLLoss, or give the logits to CrossEntropyLoss, "
                   "which does both")


def _wrong_dim(result: Result, engine) -> None:
    got = engine.checks.get("loss_dim")
    if got:
        step, loss, over, classes, batch = got
        result.add("log-softmax-dim", "warning", "", f"{loss} got a log_softmax taken over a dimension of {over} at step "
                   f"{step}, where its classes are {classes}: each sample's log-probabilities are normalised over "
                   "something else than its classes" + (" (the batch, at dim=0)" if over == batch else ""),
                   "take log_softmax over the classes: dim=1 for (N, C) logits, dim=-1 for (..., C); or give the "
                   "logits to cross_entropy")


def _sigmoid_into_logits(result: Result, engine) -> None:
    got = engine.checks.get("sigmoid_into_loss")
    if got:
        step, loss = got
        result.add("probabilities-into-loss", "warning", "", f"{loss} got a sigmoid's output at step {step}: it applies "
                   "the sigmoid itself, so its inputs stay in (0, 1) and the loss cannot fall below softplus(−1) = "
                   f"{math.log1p(math.exp(-1)):.4f} for a label of 1, ln 2 = {math.log(2):.4f} for a label of 0 "
                   "(without weights)",
                   "return the logits (drop the sigmoid at the end of the model); apply the sigmoid only for "
                   "predictions, or give the probabilities to binary_cross_entropy")


def _dropout_into_loss(result: Result, engine) -> None:
    got = engine.checks.get("dropout_into_loss")
    looks, exact = engine.checks.get("dropout_looks", (0, 0))
    if got and exact < looks:   # every mask averaging exactly 1: a label mask made to (graph._dropped)
        step, loss, share = got
        zeroed = f"{share:.0%} of its values (that batch's draw)" if math.isfinite(share) else "a share of its values"
        result.add("dropout-into-loss", "warning", "", f"{loss}'s input came out of a dropout at step {step}: in "
                   f"training {zeroed} are zeroed at random and the rest scaled up, so the loss judges values the model "
                   "did not give, corrupted anew each step (in eval mode they are whole)",
                   "drop the dropout after the last layer (a dropout belongs before a layer that learns from its "
                   "output, not on the output the loss reads)")


def _broadcast(result: Result, engine) -> None:
    got = engine.checks.get("loss_broadcast")
    if not got:
        return
    step, loss, x, y, both = got
    shape = lambda s: "x".join(map(str, s)) or "a scalar"   # noqa: E731
    result.add("loss-broadcasts", "warning", "", f"{loss} got an input of {shape(x)} and a target of {shape(y)} at step "
               f"{step}: they broadcast to {shape(both)}, so each prediction is compared with other samples' targets"
               + (" (every prediction with every target)" if len(both) == 2 and both[0] == both[1] > 1 else ""),
               "give both the same shape (target.view_as(output), or output.squeeze(-1))")


def _finite_pairs(steps, values):
    return [(s, v) for s, v in zip(steps, values) if v is not None and math.isfinite(v)]


def _clock_track(engine):
    """The Track of the optimizer whose steps count the run's, or None."""
    return engine.tracks.get(id(engine.clock)) if engine.clock is not None else None


def _climbs(engine) -> bool:
    """The counted optimizer maximizes (maximize=True): its steps climb the loss, so the objective is −loss."""
    clock = _clock_track(engine)
    return clock is not None and clock.maximizes()


def _trains_a_model(engine, track) -> bool:
    """Some of the optimizer's parameters are a watched model's (not an input's perturbation alone)."""
    held = {id(p) for r in engine.roots.values() for p in r.parameters()}
    return any(id(p) in held for p in track.params)


def _climbed_loss(result: Result, engine) -> bool:
    """The run's one optimizer climbs a loss that is one of torch's own (a cross-entropy, an MSE: a quantity to
    minimise), read from its graph: `maximize=True` on it (maximize-on-loss), or it minimised minus it
    (negated-loss), and the loss did rise. True when said: its climbing curve is that cause, not a learning rate (a
    sweep: Adam(maximize=True) on cross_entropy, 2.5 -> 3.3e4, was told to lower the rate)."""
    seen = engine.checks.get("loss_minimised")   # (step, loss, the sign the loss was taken with)
    one = sum(not t.retired for t in engine.tracks.values()) == 1   # a GAN's generator climbs its critic's loss
    climbs, clock = _climbs(engine), _clock_track(engine)
    # the weights of a model: an attack's perturbation, the optimizer's only tensor, climbs the loss by design
    if not seen or not one or (seen[2] < 0) == climbs or clock is None or not _trains_a_model(engine, clock):
        return False
    values = [seen[2] * v for _, v in _finite_pairs(result.series["step"], result.series["loss"])]
    w = window(len(values))
    if len(values) < 2 * w or statistics.median(values[-w:]) <= statistics.median(values[:w]):
        return False   # it did not climb (yet)
    loss = f"{'a cross-entropy' if seen[1] == 'nll_loss' else seen[1]} (read from its graph at step {seen[0]}: " \
           f"{seen[1]} at its root)"
    first, last = statistics.median(values[:w]), statistics.median(values[-w:])
    rose = f"it rose from {first:.4g} to {last:.4g} (first and last {w} steps' medians)"
    kind = clock.kind
    # a warning: unlearning climbs its forget set's loss on purpose (a review: a fine-tune from a checkpoint, exit 1)
    if climbs:
        result.add("maximize-on-loss", "warning", "", f"{kind} has maximize=True: each step climbs the loss, {loss}, "
                   f"a quantity to minimise; {rose}",
                   "drop maximize=True: it is for an objective to raise (a reward, a log-likelihood); unless the "
                   "run un-learns on purpose")
    else:
        result.add("negated-loss", "warning", "", f"the loss is minus {loss}: each step climbs "
                   f"it, a quantity to minimise; {rose}",
                   "drop the minus sign (to raise it on purpose, as unlearning does, expect it to climb without bound)")
    return True


def _curves(result: Result, engine) -> None:
    opts = engine.opts
    steps = result.series["step"]
    if _climbed_loss(result, engine):
        return
    climbs = _climbs(engine)   # the run raises its loss: judged as −loss (a sweep: a log-likelihood's rise was an error)
    losses = [-v if climbs and v is not None else v for v in result.series["loss"]]
    pairs = _finite_pairs(steps, losses)
    # a loss that depends on no parameter moves with the data only: its spikes and climbs say nothing of training
    constant = len(engine.tracks) == 1 and any(f.code == "loss-ignores-parameters" for f in result.findings)
    parts = [(sub, of + more + (" (judged on −loss: the optimizer maximizes the loss, maximize=True)" if climbs
                                 else "")) for picked, of in _objectives(engine, steps, losses)
             for sub, more in _reach_groups(result, engine, picked) or _phases(result, engine, picked)
             or [(picked, "")]]
    for picked, of in parts:
        at = [steps[i] for i in picked]
        part = _finite_pairs(at, [losses[i] for i in picked])
        if len(part) >= 10 and not constant:
            lr_at = dict(zip(at, [result.series["lr"][i] for i in picked]))
            _loss_curve(result, part, lr_at, opts, engine.clips.seen, of, _unscaled(engine),
                        _weight_growth(engine, floored=True), _weight_growth(engine),
                        engine.small_batches, engine.batch_size, _classes(engine, parts), _moving(engine),
                        _fastest(engine))
            _lr_collapse(result, part, lr_at, of,
                         lambda first, last: engine.schedulers.each_step(first, last, engine.clock_at(last)))
        _grad_norm_explosion(result, at, [result.series["grad_norm"][i] for i in picked], part, opts,
                             engine.clips.seen, of, dict(zip(at, [result.series["lr"][i] for i in picked])))
    _validation(result, engine, pairs)


EARLY = 0.05        # of the run's read steps: a fall under EARLY_DROP of the highest rate this early, by a scheduler
EARLY_DROP = 1e-2   # stepped each batch, is said though the loss still creeps down


def _first_under(known: list, bound: float) -> int:
    """The index of the first of the last steps whose rates all stay under `bound` (len(known): the last is not)."""
    k = len(known)
    while k > 0 and known[k - 1][1] < bound:
        k -= 1
    return k


def _lr_collapse(result: Result, pairs, lr_at: dict, of: str, each_step=lambda first, last: False) -> None:
    """The rate fell under LR_COLLAPSE of its highest in the first half of the run and stayed there to the end, and
    the loss did not fall 5% after it: the rest of the run trained nothing (a sweep: StepLR(gamma=0.9) stepped per
    batch took 0.05 to 4e-14 and the loss froze at 1.54, 0.72 accuracy against 0.95; watch said pass). A schedule
    that decays to 0 reaches that only near its end (a linear decay at 99.9%, OneCycle's floor 4e-6 at its end);
    warm restarts come back up. `each_step(first, last)`: a scheduler was stepped after (nearly) every step from
    first to last (schedulers.SchedulerCalls)."""
    known: list[tuple[int, float]] = [(s, float(lr_at[s])) for s, _ in pairs if lr_at.get(s) is not None]
    top = max((v for _, v in known), default=0.0)
    if len(known) < 10 or top <= 0:
        return
    # (100x: MultiStepLR's two cuts of 0.1 leave 0.1 at 0.0010000000000000002, a hair over 0.01 x 0.1)
    k, early = _first_under(known, LR_COLLAPSE * top), _first_under(known, EARLY_DROP * top * (1 + 1e-9))
    if k == len(known) and early <= EARLY * len(known):   # (early: then only with a scheduler stepped each batch)
        k = early
    if k == len(known) or k > len(known) // 2:
        return
    step = known[k][0]
    values = [v for _, v in pairs]
    w = window(len(values))
    i = next(j for j, (s, _) in enumerate(pairs) if s >= step)
    # the loss as the collapse left it: its first w steps from there, not a window before it, which reaches back
    # into the first steps' fall and the batches' noise (a review: a collapse at step 31 of a window of 40 measured
    # 4.68, then 3.91 over its last 16 steps, against a frozen model's 3.51 at the end, and passed)
    before, end = statistics.median(values[i:i + w]), statistics.median(values[-w:])
    def learning(first_cut: int) -> bool:   # the loss fell from just before the first cut (the later half of the
        j = next(j for j, (s, _) in enumerate(pairs) if s >= first_cut)   # steps before it) to the collapse
        return j > 1 and _fell(values[max(j // 2, j - w):j], values[max(j, i - w):i + 1])

    # a scheduler stepped after every step to the collapse counts batches, whatever its cuts look like (StepLR(30,
    # 0.1) stepped per batch: the cuts held the loss flat from the first on, so `learning` could not see it), where
    # the steps' batches differ: a loss without noise from step to step is one batch an epoch (full-batch training,
    # where per epoch is per step: a review's regression at its optimum was called collapsed)
    stepped = each_step(known[0][0], step) and _step_noise([math.log(v) for v in values if v > 0], w) > ONE_BATCH
    # a fall in the first EARLY share of the run by a scheduler stepped each batch is said though the loss still
    # creeps down, and under EARLY_DROP (a sweep: MultiStepLR([6, 9]) meant per epoch, stepped per batch, 0.1 to 0.001 by step 9 of 940;
    # SGD with momentum kept falling, to a validation loss of 1.064 against its twin's 0.923)
    fell = _fell(values[i:i + w], values[-w:])
    if (fell or known[k][1] >= LR_COLLAPSE * top) and not (stepped and k <= EARLY * len(known)):
        return
    if not stepped and not _decays_per_step(known, k, learning):
        return
    result.add("lr-collapsed", "warning", "", f"the learning rate fell from {top:.3g} to {known[k][1]:.3g} by step "
               f"{step}, {100 * k / len(known):.2g}% into the run's {known[-1][0]} steps, and stayed under "
               f"{LR_COLLAPSE if known[k][1] < LR_COLLAPSE * top else EARLY_DROP:g}× its highest to the "
               f"end; the loss went from {before:.4g} to {end:.4g} over the rest{of}",
               ("a scheduler was stepped after every optimizer step: " if stepped else "") +
               "a scheduler stepped per batch where it was meant per epoch (StepLR and ExponentialLR count their own "
               "step() calls), or a gamma or milestones far too small"
               # (the early rule: a short high-rate phase can be on purpose, a review's two-phase schedule)
               + ("; nothing to do if a short phase at the high rate was the plan" if fell else ""))


def _median_se(xs: list[float]) -> float:
    """The standard error of a median of `xs` (1.253 × 1.4826 × MAD / √n: a normal's, robustly)."""
    m = statistics.median(xs)
    return 1.253 * 1.4826 * statistics.median(abs(x - m) for x in xs) / math.sqrt(len(xs))


def _fell(first: list[float], last: list[float]) -> bool:
    """`last`'s median below `first`'s by 5% of it and by twice the standard error of the difference of the two
    medians: batch losses of a frozen model spread 2-7 and their medians over 40 steps differ by 8% by chance (a
    review)."""
    a, b = statistics.median(first), statistics.median(last)
    return b < a - max(0.05 * abs(a), 2 * math.hypot(_median_se(first), _median_se(last)))


def _decays_per_step(known: list, k: int, learning=lambda step: True) -> bool:
    """Did the rate change at more than half of the steps before it went under, or at 3 changes or more, at most
    STEPPED_GAP steps apart from the run's first step on, or by the same factor at the same interval from the first
    step (a scheduler stepped per batch, its step_size counted in batches)? One stepped per epoch,
    or ReduceLROnPlateau, changes it a few times with long flat stretches between (a review: a run at its noise floor,
    cut 0.5 -> 5e-5 by ReduceLROnPlateau as designed, was called collapsed). StepLR(step_size=2, gamma=0.5) stepped
    per batch changed it at half the steps, and at a third with step_size=3: passed (a sweep: 0.34 accuracy against
    0.97)."""
    cuts = [(s, b / a) for (_, a), (s, b) in zip(known[:k], known[1:k + 1]) if a != b and a > 0]
    at = [s for s, _ in cuts]
    gaps = [b - a for a, b in zip([known[0][0]] + at, at)]   # from the first step: a count of batches starts there;
    # ReduceLROnPlateau cuts after a flat stretch (a review: patience 1 on one batch an epoch, cuts 2-3 steps apart
    # from step 65 of a run at its optimum, was called stepped per batch)
    if len(at) > k / 2 or (len(at) >= 3 and max(gaps) <= STEPPED_GAP):
        return True
    # StepLR(step_size=30, gamma=0.1) stepped per batch: the same cut every 30 steps from the first (a second
    # review: 0.05 -> 5e-15, the loss 1.29 against 0.24 without it, passed), while the loss was still falling from
    # the first cut on (`learning(step)`): the same schedule stepped per epoch on a run already at its noise floor is
    # the schedule working (a third review: MultiStepLR([10, 20, 30, 40]) per epoch of 5 batches at the optimum)
    factors = [f for _, f in cuts]
    return (len(at) >= 3 and max(gaps) - min(gaps) <= 1 and max(factors) <= min(factors) * (1 + 1e-6)
            and learning(at[0]))


def _objectives(engine, steps: list, losses: list) -> list[tuple[list[int], str]]:
    """The series' indices of each objective the counted steps trained, with what a finding says of it ("" when one).
    The count goes on when another optimizer takes it over (engine._choose_clock); one whose parameters are not nested
    with those of the one before (a second task's head and the trunk, a fine-tuning head and the encoder after
    pretraining the encoder with a decoder) trains another loss, whose curve is not the first one's (a review: two
    tasks on a shared trunk, then one alone, joined a cross-entropy and an MSE into a spike and an error), unless its
    first loss goes on from the last ones (_goes_on: the same loss over overlapping parameters; a review's blow-up
    there was judged as "2 objectives"). Nested ones (an optimizer made again, layers unfrozen, the head alone) go on
    with the same curve; tasks that take turns each have theirs."""
    group: dict[int, int] = {}
    starts: list[tuple[int, int]] = []   # (first step, group)
    at = {s: i for i, s in enumerate(steps)}
    # two optimizers train one loss only if every handover between them goes on (a review: tasks in turns of 20
    # steps whose levels matched at the first handover would have been one curve for the rest of the run)
    goes_on: dict[frozenset, bool] = {}
    since = 0
    for first, new, old, _ in engine.handovers:
        pair = frozenset((new, old))
        goes_on[pair] = goes_on.get(pair, True) and first in at and _goes_on(losses[since:at[first] + 1])
        since = at.get(first, since)
    for first, new, old, nested in engine.handovers:
        if not starts:
            starts.append((0, group.setdefault(old, old)))
        same = nested or goes_on[frozenset((new, old))]
        group[new] = group.get(old, old) if same else group.get(new, new)
        starts.append((first, group[new]))
    if len({g for _, g in starts}) < 2:
        return [(list(range(len(steps))), "")]
    parts: dict[int, list[int]] = {}
    k = 0
    for i, step in enumerate(steps):
        while k + 1 < len(starts) and step >= starts[k + 1][0]:
            k += 1
        parts.setdefault(starts[k][1], []).append(i)
    tracks = {id(t): t for t in engine.tracks.values()}
    out = []
    for key, picked in parts.items():
        theirs = set().union(*(t.ids.keys() for k, t in tracks.items() if group.get(k, k) != key))
        out.append((picked, f" (judged on the {len(picked)} steps of {_objective(tracks.get(key), theirs)} apart, "
                            f"{steps[picked[0]]}–{steps[picked[-1]]}: the count passed between optimizers over different "
                            f"parameters, {len(parts)} objectives)"))
    return out


def _reach_groups(result: Result, engine, picked: list[int]) -> list[tuple[list[int], str]] | None:
    """The steps of one objective split by the set of parameters their gradients reached (engine.reach), where they
    are tasks taken in turns: at least two sets of REACH_MIN steps or more, changing REACH_TURNS times or more, at
    different levels of loss (REACH_LEVELS apart; gradient norms alone do not split: an explosion is 20x), each level
    with parameters every step of it reached and no other level's did (its task's head: blocks skipped at random in
    one task reach nested sets at two levels of loss, and are no tasks, a review). A task sampled per step
    through its own head: a regression's loss of 1e4 between cross-entropies of 2 was a loss-spike and its norm an
    explosion (a review). Sets at one level are one group (experts routed per batch under two tasks: two groups, not
    one per expert); a rarer set's steps go with the group whose sets share the most of its parameters (a corrupt
    batch that saturated a router into a set of its own is judged with its task: a review). A head unfrozen once is a
    phase, not a turn; more sets than engine.REACH_SETS tells apart, no split."""
    reach = engine.reach
    if len(reach) != len(result.series["step"]):
        return None
    known = [i for i in picked if reach[i] is not None]
    if len(known) < 0.95 * len(picked):
        return None
    by: dict[int, list[int]] = {}
    for i in known:
        by.setdefault(reach[i], []).append(i)
    major = {k: v for k, v in by.items() if len(v) >= REACH_MIN}
    order = [reach[i] for i in known if reach[i] in major]
    turns = sum(a != b for a, b in zip(order, order[1:]))
    if len(major) < 2 or turns < REACH_TURNS:
        return None
    levels = _by_level(major, result.series["loss"])
    if len(levels) < 2:
        return None
    sets = engine.reach_sets
    groups = [[i for k in ks for i in major[k]] for ks in levels]
    held = [frozenset().union(*(sets[k] for k in ks)) for ks in levels]
    others = [frozenset().union(*(o for j, o in enumerate(held) if j != g)) for g in range(len(levels))]
    # each set holds parameters no other level's steps reached (a task's head): sets nested in another level's (blocks
    # skipped at random in one task, at two levels of loss) are no tasks (a review)
    if any(not sets[k] - others[g] for g, ks in enumerate(levels) for k in ks):
        return None
    # what every step of a level reached and no other level's did (a task's head, not an expert some steps chose); a
    # level of several tasks has none in common, and is named by what its steps reached alone
    common = [frozenset.intersection(*(sets[k] for k in ks)) - others[g] for g, ks in enumerate(levels)]
    own = [c or held[g] - others[g] for g, c in enumerate(common)]
    for k, idx in by.items():   # a rarer set: with the level whose own parameters (a task's head) it reached most
        if k not in major:
            near = max(range(len(levels)), key=lambda g: (len(sets[k] & common[g]), len(sets[k] & own[g]),
                                                           max(_shared(sets[k], sets[m]) for m in levels[g])))
            groups[near] += idx
    result.notes.append(f"the steps' gradients reached {len(major)} sets of parameters in turns ({turns} changes: "
                        f"tasks taken in turns, each through parameters of its own), at {len(levels)} levels of "
                        "loss: the loss and gradient norm are judged per level")
    return [(sorted(idx), f" (judged on the {len(idx)} steps whose gradient "
                          f"{_reach_words(own[g], held[g], others[g])}"
                          f": {len(levels)} tasks taken in turns)") for g, idx in enumerate(groups)]


def _phases(result: Result, engine, picked: list[int]) -> list[tuple[list[int], str]] | None:
    """The steps of one objective split where a term joined its loss: the first step whose gradient reached parameters
    no step before it had, each step after it reaching them too (the share PHASE_HELD), with REACH_MIN steps on each
    side, and its loss above the range of the REACH_MIN losses before it. A sweep: a regression head's MSE (~1e3)
    switched on at step 101 beside a cross-entropy of 0.3 was `loss-diverged` (an error), `loss-spike` and
    `grad-norm-explosion`, the loss falling from there on. Layers unfrozen reach new parameters too, but the loss goes
    on within its range (one curve, as before); a gate opened at the first steps has too few steps before it."""
    reach, sets, losses = engine.reach, engine.reach_sets, result.series["loss"]
    if len(reach) != len(result.series["step"]) or any(reach[i] is None for i in picked):
        return None
    cuts: list[tuple[int, frozenset, float, float]] = []
    seen: frozenset = frozenset()
    for n, i in enumerate(picked):
        new = sets[reach[i]] - seen
        seen |= sets[reach[i]]
        if not new or n < REACH_MIN or len(picked) - n < REACH_MIN or (cuts and n - cuts[-1][0] < REACH_MIN):
            continue
        held = sum(new <= sets[reach[j]] for j in picked[n:]) >= PHASE_HELD * (len(picked) - n)
        before = [losses[j] for j in picked[n - REACH_MIN:n]]
        v = losses[i]
        if held and _finite(before + [v]) and v > max(before) and _fell_after(losses, picked[n:]):
            cuts.append((n, new, v, max(before)))
    if not cuts:
        return None
    steps = result.series["step"]
    bounds = [0] + [n for n, *_ in cuts] + [len(picked)]
    for n, new, v, top in cuts:
        result.notes.append(f"at step {steps[picked[n]]} the gradients first reached {_names_of(new)} and the loss "
                            f"left its range ({v:.4g} after at most {top:.4g} over the {REACH_MIN} steps before): a "
                            "term joined the loss (a head or a loss switched on), so the curve is judged per phase")
    return [(picked[a:b], f" (judged on the {b - a} steps {steps[picked[a]]}–{steps[picked[b - 1]]} apart: "
                          + (f"a term joined the loss at step {steps[picked[b]]})" if not a else
                             "from where a term joined the loss)")) for a, b in zip(bounds, bounds[1:])]


def _finite(values: list) -> bool:
    return all(v is not None and math.isfinite(v) for v in values)


def _fell_after(losses: list, idx: list[int]) -> bool:
    """The loss from a joined term on fell: its last REACH_MIN steps' median below its first's (a term being trained;
    a blow-up that stays up, its dead units revived into new gradients, is no phase: the curve keeps judging it)."""
    first = [losses[j] for j in idx[:REACH_MIN]]
    last = [losses[j] for j in idx[-REACH_MIN:]]
    return _finite(first + last) and statistics.median(last) < statistics.median(first)


def _names_of(names) -> str:
    """Two names of a set, and how many more."""
    ns = sorted(names)
    return ", ".join(ns[:2]) + (f" and {len(ns) - 2} more" if len(ns) > 2 else "")


def _by_level(major: dict, values: list) -> list[list[int]]:
    """The sets (keys of `major`, each its steps' indices) grouped by the median of `values` over their steps: in
    rising order, a set joins the group before it while its median is within REACH_LEVELS of that group's highest
    (one task's sets spread over its experts chain into one level: a review's 16 experts made four). A set with no
    finite positive value makes one group of all (no level to tell)."""
    meds = {}
    for k, idx in major.items():
        ok = [v for v in (values[i] for i in idx) if v is not None and math.isfinite(v) and v > 0]
        if not ok:
            return [list(major)]
        meds[k] = statistics.median(ok)
    out: list[list[int]] = []
    for k in sorted(meds, key=lambda k: meds[k]):
        if out and meds[k] <= REACH_LEVELS * meds[out[-1][-1]]:
            out[-1].append(k)
        else:
            out.append([k])
    return out


def _shared(a: frozenset, b: frozenset) -> float:
    return len(a & b) / max(1, len(a | b))


def _reach_words(own: frozenset, names: frozenset, others: frozenset) -> str:
    """A group by what sets it apart: the parameters each of its steps reached and no other group's did ("reached
    heads.reg.weight and 1 more"), else those the others reached and it did not."""
    lacks = others - names
    return (f"reached {_names_of(own)}" if own else f"did not reach {_names_of(lacks)}" if lacks
            else "reached other parameters")


def _goes_on(losses: list, w: int = 10) -> bool:
    """`losses`: the old optimizer's run, then the new one's first. Is that one within the range of the last w before
    it, the old one having held the count for w steps at least? The first step of a new optimizer is computed on the
    weights the last one left: the same loss goes on from where it was, another starts at its own level (an MSE of
    0.01 after a cross-entropy of 1). Shorter runs are not read (tasks that take turns every 3 steps, a meta-learning
    loop's 5 inner steps a task: a task's loss within the last one's range by chance joined them)."""
    before = [v for v in losses[-w - 1:-1] if v is not None and math.isfinite(v)]
    v = losses[-1] if losses else None
    return len(before) >= w and v is not None and math.isfinite(v) and min(before) <= v <= max(before)


def _objective(t, theirs: set) -> str:
    """An optimizer named by its type and the parameters it holds that the other objectives' optimizers do not (a
    task's head: "SGD over 1.weight, 1.bias")."""
    if t is None:
        return "one objective"
    own = [t.names[i] for i, p in enumerate(t.params) if id(p) not in theirs] or list(t.names)
    return f"{t.kind} over " + ", ".join(own[:2]) + (f" and {len(own) - 2} more" if len(own) > 2 else "")


def _grad_norm_explosion(result: Result, steps, grad_norms, loss_pairs, opts, clipped: bool = False,
                         of: str = "", lr_at: dict | None = None) -> None:
    """A gradient-norm spike judged as a loss spike is (above `explode` x the running median, far outside the
    norms' own spread, above any norm of the spread's steps before it) that the run felt (_felt). At batch size 1
    a healthy run's per-sample norms span decades and a rare hard sample is a harmless spike (so_31880720's
    correct version: 34 after a median of 0.002, the loss unmoved, the norms back at once)."""
    norms = _finite_pairs(steps, grad_norms)
    values = [v for _, v in norms]
    w = window(len(norms))
    for i in range(w, len(norms)):
        base = statistics.median(values[i - w:i])
        peak = max(values[max(0, i - SPREAD_STEPS * w):i])
        if not (base > 0 and values[i] > opts.explode * base and values[i] >= peak and _outside_spread(values, i, w)):
            continue
        last = i == len(norms) - 1 and not _nonfinite_from(result, norms[i][0])   # no step after it shows its effect
        seen = _recurring(values, i, w, math.sqrt(opts.explode)) if last else []
        if seen and values[i] <= math.sqrt(opts.explode) * max(seen):
            # like the spikes the run went on from (a sweep: an epoch's last batch of 3 through BatchNorm, 7.5-21.5
            # each epoch, 38.6 at the run's last step, was said there only); a first one at the end, or one that ends
            # a rise, is still said (reviews: a corrupted last batch left the final model at chance; one bump earlier
            # in the run excused a last-step explosion)
            result.notes.append(f"the gradient norm {values[i]:.3g} at step {norms[i][0]}, the last step, is "
                                f"{values[i] / base:.3g}× its running median, within √{opts.explode:g} of the "
                                f"{len(seen)} spikes the run had before and went on from (up to {max(seen):.3g}): "
                                "judged one more of them, not an explosion; no step after it shows what this last "
                                "update did (a short last batch each epoch makes such spikes: DataLoader(drop_last="
                                "True) avoids them)")
            return
        if last or _felt(result, loss_pairs, values, i, norms[i][0], w, math.sqrt(opts.explode)):
            result.add("grad-norm-explosion", "warning", "", f"gradient norm {values[i]:.3g} at step {norms[i][0]} "
                       f"is {values[i] / base:.3g}× its running median ({base:.3g}), far outside its spread over the "
                       f"{min(i, SPREAD_STEPS * w)} steps before it and above any of them (the highest: {peak:.3g}){of}",
                       _explosion_hint(norms, lr_at or {}, i, w, clipped))
            return


def _recurring(values: list[float], i: int, w: int, factor: float) -> list[float]:
    """The run's earlier norm spikes (each `factor` × the running median before it or more) before the window of
    values[i] (not the rise it ends), where they came in 2 episodes or more (spikes w steps apart or more: one bump of
    15 spikes over steps 60-80 excused a last-step explosion, a review): a recurring kind the run went on from; else
    []."""
    at = [k for k in range(w, i - w) if values[k] >= factor * statistics.median(values[k - w:k])]
    episodes = sum(1 for a, b in zip([-w - 1] + at, at) if b - a > w)
    return [values[k] for k in at] if episodes >= 2 else []


def _felt(result: Result, loss_pairs, norms: list[float], i: int, step: int, w: int, factor: float) -> bool:
    """Did the run feel the spike at norms[i] (at `step`)? Any of:
    - the norms stay high: the median of the next w is above `factor` (√explode) x the running median and within
      `factor` of the spike itself (after a harmless spike they fall back: so_31880720, 34 -> 0.06);
    - the loss goes non-finite at or after it;
    - the loss leaves its own spread within a window after that step, by a tenth of where it started at least.
      The loss of the spike's own step is its cause, not what the update did (a hard sample at batch size 2: a high
      loss and a high norm, then both back; a review's healthy digits runs warned there);
    - the spike's own loss left its spread and the median of the next 3 stays above the one before by that tenth and
      outside the spread a median of 3 has (a corrupted batch: 0.06, 65, then 0.83, 1.83, 2.94, each inside a noisy
      run's spread on its own: a second review).
    A loss that took negative values in the windows before (_signed) is not asked: the norms and non-finite decide.
    With no loss seen at all (backward not through Tensor.backward) the norms alone decide."""
    if _nonfinite_from(result, step):
        return True
    after = norms[i + 1:i + 1 + w]   # empty only where the norms after it were not finite (a review: a spike, then
    base = statistics.median(norms[i - w:i])   # NaN from the next step, stopped the run's end with StatisticsError)
    if after and statistics.median(after) > max(factor * base, norms[i] / factor):
        return True
    values = [v for _, v in loss_pairs]
    if not values:
        return True
    at = next((k for k, (s, _) in enumerate(loss_pairs) if s > step), len(loss_pairs))
    lw = window(len(values))
    if _signed(values, at, lw):   # a loss of both signs tells nothing by its rises (a sweep: a converged REINFORCE
        return False              # policy's rare exploratory step, the norms back at once, was "felt" by noise)
    # a rise that matters at the run's own scale: a tenth of where the loss started at least (a loss sitting at
    # float32's floor, 1e-7, spreads by nothing, so 3e-5 would be "outside" it)
    scale = 0.1 * abs(statistics.median(values[:lw]))
    own = at - 1 if at > 0 and loss_pairs[at - 1][0] == step else None
    if own is not None and own >= lw and _outside_spread(values, own, lw) and len(values[own + 1:own + 4]) == 3:
        after = statistics.median(values[own + 1:own + 4])   # the median of 3 spreads 0.67x one value (a normal's)
        if (after - statistics.median(values[own - lw:own]) > scale
                and _outside_spread(values, own, lw, v=after, k=0.67 * SPREAD_K)):
            return True
    return any(_outside_spread(values, k, lw) and values[k] > statistics.median(values[k - lw:k])
               and values[k] - statistics.median(values[k - lw:k]) > scale
               for k in range(max(at, lw), min(len(values), at + w)))


SIGNED_SHARE = 0.25   # _signed: below 0 at this share of the steps before, or more


def _signed(values: list[float], i: int, w: int) -> bool:
    """The loss was below 0 at SIGNED_SHARE or more of the SPREAD_STEPS·w steps before values[i]: an objective that
    is no non-negative loss (a policy gradient's surrogate, 82% below 0 near -1e-4 once converged; a critic's), whose
    ratios and relative rises mean nothing: judged by its norms and non-finite values alone. A loss that dips below 0
    now and then stays judged (a review: a Gaussian NLL near its optimum, -0.11..0.30, knocked to 82.8 by a corrupted
    batch, lost both its warnings to one negative value)."""
    recent = values[max(0, i - SPREAD_STEPS * w):i]
    return bool(recent) and sum(1 for v in recent if v < 0) >= SIGNED_SHARE * len(recent)


def _nonfinite_from(result: Result, step: int) -> bool:
    """The loss went non-finite at `step` or after it."""
    return any(v is not None and not math.isfinite(v) for s, v in zip(result.series["step"], result.series["loss"])
               if s >= step)


def _one_sample_back(values, i: int, w: int, base: float, initial: float, spike: float, batch: int | None) -> bool:
    """A run whose every batch is SMALL_BATCH samples or fewer: each step's loss is a sample's own. One the run did not
    feel (the median of the w steps after it, w of them read, back under spike × base, as grad-norm-explosion asks)
    and within spike × what the untrained model's samples lost (`initial`) is a misfit sample, not the run's (a port
    at batch 1 with a BCE clipped at 1e-7: 2.66 read 2.2e7× the floor, against 0.69 at the start; acc 1.0). One far
    beyond what even the untrained model lost stays a spike: an outlier the data holds (a sample 300 off, 9e4)."""
    from .engine import SMALL_BATCH

    after = values[i + 1:i + 1 + w]
    return (batch is not None and batch <= SMALL_BATCH and len(after) == w and values[i] <= spike * initial
            and statistics.median(after) <= spike * base)


def _loss_curve(result: Result, pairs, lr_at: dict, opts, clipped: bool = False, of: str = "",
                unscaled: str = "", growth: float | None = None, raw_growth: float | None = None,
                small: dict | None = None, batch: int | None = None, classes: int = 0,
                moving: float | None = None, fastest: float | None = None) -> None:
    """`growth`: the weights' norm over the run beyond a standard init's scale (_weight_growth floored); `raw_growth`:
    over their first norm; `classes`: the class count of a loss that is a cross-entropy (_classes), else 0."""
    values = [v for _, v in pairs]
    w = window(len(values))
    med = running_medians(values, w)
    initial = med[w - 1]
    best_i = min(range(w - 1, len(med)), key=lambda i: med[i])
    peak = initial   # the highest the loss has been since its first window: a spike goes above it
    spiked = None
    own: list[int] = []   # a sample's own losses at batch size 1-2 (_one_sample_back)
    for i in range(w, len(values)):
        base = statistics.median(values[i - w:i])
        # ratios need a positive scale: a loss that can be negative (a GAN's, an RL objective) has no spike ratio,
        # whatever its median (a sweep: per-episode REINFORCE, -5.8 for a failed episode and +7..+30 for a success,
        # its median 0.92: an ordinary success read 30x a spike)
        if base > 0 and values[i] > opts.spike * base and values[i] > peak and not _signed(values, i, w) \
                and _outside_spread(values, i, w):
            if small and pairs[i][0] in small:   # a few samples' loss (an epoch's last batch of 1: one noisy sample,
                result.notes.append(   # 7.0 against a median of 0.57, a review's healthy run), not the run's
                    f"the loss {values[i]:.4g} at step {pairs[i][0]} ({values[i] / base:.1f}× its running median) came "
                    f"from a batch of {small[pairs[i][0]]} sample(s) where the others have {batch}: a few samples' "
                    "loss, not judged as a spike of the run")
                continue
            if _one_sample_back(values, i, w, base, initial, opts.spike, batch):
                if not own:   # one note for the run (a review: recurring ones made 17)
                    at_note = len(result.notes)
                    result.notes.append(
                        f"the loss {values[i]:.4g} at step {pairs[i][0]} ({values[i] / base:.1f}× its running median) "
                        f"came from a batch of {batch} sample{'s' if (batch or 0) > 1 else ''}, as every step of this "
                        f"run, and the next steps came back to {statistics.median(values[i + 1:i + 1 + w]):.4g} "
                        "(median): a sample's own loss, not judged as a spike of the run")
                own.append(i)
                peak = max(peak, values[i])   # a value the run had: a later, lower one is no spike (a review)
                continue
            result.add("loss-spike", "warning", "", f"loss {values[i]:.4g} at step {pairs[i][0]} is "
                       f"{values[i] / base:.1f}× its running median ({base:.4g}), far outside the spread of the "
                       f"{min(i, SPREAD_STEPS * w)} steps before it and above any loss since step {pairs[w - 1][0]}{of}",
                       _spike_hint(pairs, lr_at, i, w, clipped))
            spiked = i
            break
        peak = max(peak, values[i])
    if len(own) > 1:
        result.notes[at_note] += f" ({len(own) - 1} more such, the last at step {pairs[own[-1]][0]})"
    diverged = _diverged(med[-1], med[best_i], initial) and _climb_beyond_noise(values, w, med[-1])
    if not diverged and growth is not None and growth >= BLOWN_GROWTH and _held_above_first(values, med, w):
        low = min(range(w - 1, len(med)), key=lambda i: med[i])
        top = max(range(w - 1, len(med)), key=lambda i: med[i])
        back = (f"never came back: at least {med[low]:.4g} (step {pairs[low][0]})" if med[low] >= 2 * values[0] else
                f"came back only part of the way: {med[top]:.4g} at step {pairs[top][0]}, above its start to the end")
        result.add("loss-diverged", "error", "", f"the loss went from {values[0]:.4g} at step {pairs[0][0]} (before its "
                   f"update) to {med[w - 1]:.4g} (running median, step {pairs[w - 1][0]}) and "
                   f"{back}, {med[-1]:.4g} at step {pairs[-1][0]}, while the weights' norm grew {growth:.3g}× over the run (from where it started, or from a "
                   f"standard initialisation's scale where it started below){of}",
                   "the updates outgrew the weights and left the model worse than it started: lower the learning rate "
                   "(10× for a start), or look for an update that climbs the loss (a negated loss, maximize=True)")
        return
    if not diverged and growth is not None and growth >= BLOWN_GROWTH and _at_chance(classes, med[-1]) \
            and _blown_and_back(values, med, w):
        peak_i = max(range(1, len(values)), key=lambda i: values[i])
        result.add("loss-diverged", "warning", "", f"the loss went from {values[0]:.4g} at step {pairs[0][0]} (before "
                   f"its update) to {values[peak_i]:.4g} at step {pairs[peak_i][0]} and came back no lower than where it started, {med[-1]:.4g} at step "
                   f"{pairs[-1][0]}, while the weights' norm grew {growth:.3g}× over the run (from where it started, "
                   f"or from a standard initialisation's scale where it started below): it learned nothing it kept, "
                   f"at chance (ln {classes} = {math.log(classes):.4g}){of}", "the first updates were too large for the weights: lower the learning rate (10× for a start), "
                   "or warm it up")
        return
    if not diverged and growth is not None and growth >= BLOWN_GROWTH and classes >= 2 and values[0] > 0 \
            and med[-1] >= max(CHANCE[0] * math.log(classes), 0.9 * values[0]):
        # the other side of the plateau's barely-moved warning: ended at chance, no lower than its first loss, the
        # weights outgrown (a sweep: SGD at lr 1, momentum 0.9, 1.38 -> 1.39, the weights 13x, 63 of 64 units dead,
        # was at most an info whose hint named a rate too small among the causes). _blown_and_back's shape, any peak
        result.add("loss-plateau", "warning", "", f"the loss ended no better than chance (ln {classes} = "
                   f"{math.log(classes):.4g}) and no lower than where it started ({values[0]:.4g} at step "
                   f"{pairs[0][0]}; running median {med[-1]:.4g} at step {pairs[-1][0]}) while the weights' norm "
                   f"grew {growth:.3g}× over the run (beyond a standard initialisation's scale){of}",
                   unscaled + "updates that outgrew the weights learned nothing they kept: lower the learning rate "
                   "(10× for a start)")
        return
    excursion = None if diverged else _excursion_at_any(values, [s for s, _ in pairs], w, spiked, lr_at)
    if diverged:
        result.add("loss-diverged", "error", "", f"the loss climbed from {med[best_i]:.4g} (running median, step "
                   f"{pairs[best_i][0]}) to {med[-1]:.4g} at step {pairs[-1][0]}, above where it started ({initial:.4g}"
                   f"{_first_left(values, pairs, initial, w)}){of}", _climb_hint(pairs, lr_at, pairs[best_i][0], w))
    elif excursion:
        (a, b, low), (c, d, top), came_back, start, _, rise = excursion
        back = "came back to" if came_back else "was still at"   # still: the end's own test found it within noise
        result.add("loss-diverged", "warning", "", f"the loss climbed from {low:.4g} (median of steps {a}–{b}) to "
                   f"{top:.4g} (steps {c}–{d}), above where it started ({start:.4g}), as the learning rate rose from "
                   f"{rise[1]:.3g} to {rise[2]:.3g} (step {rise[0]}), and {back} {med[-1]:.4g} (running median) at step "
                   f"{pairs[-1][0]}{of}", "lower the peak learning rate or lengthen the warm-up")
    elif _to_zero(med[-1], med[best_i]) and _climbed(med[-1], med[best_i], initial):
        result.add("loss-diverged", "info", "", f"the loss rose from {med[best_i]:.4g} (running median, step "
                   f"{pairs[best_i][0]}) to {med[-1]:.4g} at step {pairs[-1][0]}, to 0 from below: its terms vanished{of}",
                   "a converged policy's surrogate loss and entropy bonus do this; if the loss is a quantity to maximise "
                   "(a reward, a probability), it collapsed")
    elif len(values) >= 4 * w and med[-1] > 1e-3 * initial and (
            min(med[len(med) // 2:]) >= 0.99 * med[len(med) // 2]
            # a noisy curve whose running median dips by chance: the halves' medians (a sweep: a sigmoid on a
            # regression output, batch losses 18k–34k, flat for 88 steps, said nothing)
            or _halves_flat(values)):
        # never learned (GPT-2 at lr 0.1 stayed at chance): "converged" would mislead. Where it started is the first
        # window's median and the first 3 losses' (a run that fell within the first window fell: a review)
        start = statistics.median(values[:3])
        never = initial > 0 and min(med[w - 1:]) >= 0.97 * max(initial, start)
        still = _barely_moved(fastest, pairs[-1][0])
        if never and still and classes >= 2 and med[-1] >= CHANCE[0] * math.log(classes):   # at chance or above it
            result.add("loss-plateau", "warning", "", f"the loss never fell below where it started (running median "
                       f"{initial:.4g} at step {pairs[w - 1][0]}, {med[-1]:.4g} at step {pairs[-1][0]}), no better "
                       f"than chance (ln {classes} = {math.log(classes):.4g}), while the weights barely moved: {still}{of}",
                       unscaled + f"a learning rate too small to learn (it ended at {lr_at.get(pairs[-1][0], float('nan')):.3g}): "
                       "raise it (torchdiag lr-find suggests one); at a rate of the usual size, a gradient too small "
                       "to move the weights (torchdiag gradflow)")
        elif never:
            result.add("loss-plateau", "info", "", f"the loss never fell below where it started (running median "
                       f"{initial:.4g} at step {pairs[w - 1][0]}, {med[-1]:.4g} at step {pairs[-1][0]}){of}",
                       unscaled + _at_chance(classes, med[-1]) + "if it should learn: a learning rate too high (weights that grew many times "
                       "over, ‖w‖) or too small (update/weight), labels that do not match the inputs, or a loss that no "
                       "parameter reaches; or it was at its floor already (a fine-tune from a converged checkpoint)")
        else:
            h = len(values) // 2
            seen = (f"running median {med[len(med) // 2]:.4g} → {med[-1]:.4g}"
                    if min(med[len(med) // 2:]) >= 0.99 * med[len(med) // 2] else
                    f"median {statistics.median(values[:h]):.4g} over the first half, "
                    f"{statistics.median(values[h:]):.4g} over the second: within the steps' own noise")
            rose = _fell(values[-w:], values[h - w:h])   # the end's window above the half's, beyond their noise
            result.add("loss-plateau", "info", "", f"the loss has not improved over the second half of the run "
                       f"({seen}){of}", unscaled + _plateau_hint(raw_growth, med[-1], values[0], classes, rose,
                                                                growth if moving is not None and moving >= UPDATING
                                                                else None))


CHANCE = (0.9, 1.1)   # a cross-entropy between these shares of ln C: about what knowing nothing of the inputs scores


def _classes(engine, parts: list) -> int:
    """The class count of the run's loss where it is a cross-entropy itself (graph.loss_faults) and the run has one
    objective and one optimizer (a GAN's discriminator at ln 2 is where it should be: a review), else 0."""
    got = engine.checks.get("loss_classes")
    one = len(parts) == 1 and sum(not t.retired for t in engine.tracks.values()) == 1
    return got[1] if got and one else 0


def _rounded_away(p) -> str:
    """What steps too small to change a value of `p`'s dtype are (a sweep: a pure-bfloat16 model's hint said float32's
    1e-7, where bfloat16 rounds away any step under ~4e-3 of the value and 95% of every weight never moved)."""
    import torch

    dtype = getattr(p, "dtype", torch.float32)
    real = dtype.to_real() if dtype.is_complex else dtype if dtype.is_floating_point else torch.float32
    name = str(dtype if dtype.is_complex or dtype.is_floating_point else real).replace("torch.", "")
    said = f"steps too small to change a {name} value (below ~{torch.finfo(real).eps / 2:.0e} of it"
    if real in (torch.float32, torch.float64):
        return said + ": a fine-tune of a converged model at a small learning rate)"
    return said + (f": its rounding step); keep float32 master weights, train those, and compute in {name} under "
                   "torch.autocast (mixed precision)")


def _above_chance(classes: int, level: float) -> str:
    """A mean cross-entropy over C classes above CHANCE × ln C: worse than a classifier that knows nothing of its
    inputs, so not converged (a sweep: data sorted by label and not shuffled sat at 2.86 against ln 10 = 2.30 and was
    told "converged, or the learning rate is too small")."""
    if classes < 2 or level <= CHANCE[1] * math.log(classes):
        return ""
    return (f"it sits above chance: ln {classes} = {math.log(classes):.4g} is the cross-entropy of a classifier that "
            "knows nothing of its inputs, and this one does worse, so it has not converged: batches of one class at a "
            "time (data sorted by label and not shuffled), targets that change over the run, or a learning rate too "
            "high; ")


def _at_chance(classes: int, level: float) -> str:
    """Where the run's loss is a mean cross-entropy over C classes (read from its graph) that sits within CHANCE of
    ln C: what a classifier scores that knows only how often each class occurs (ln C for balanced classes). A sweep:
    labels shuffled apart from their inputs sat at 1.395 (ln 4 = 1.386) and were told "converged, or the learning
    rate is too small"."""
    if classes < 2 or not CHANCE[0] * math.log(classes) <= level <= CHANCE[1] * math.log(classes):
        return ""
    return (f"it sits at chance: ln {classes} = {math.log(classes):.4g} is the cross-entropy of a classifier that "
            f"knows nothing of its inputs ({classes} classes; less where some are rarer, as it learns how often each "
            "occurs): labels that do not match their inputs (shuffled apart from them), inputs that carry no signal, "
            "or a learning rate too small to learn; ")


def _moving(engine) -> float | None:
    """The median over the weight matrices of their update/weight ratio (_later_ratio): how much the updates still
    move the weights (None where none was read)."""
    matrices = {n for t in engine.tracks.values() for n, p in zip(t.names, t.params) if p.dim() >= 2}
    per = [_later_ratio(samples) for name, samples in engine.ratios.items() if samples and name in matrices]
    return statistics.median(per) if per else None


def _fastest(engine) -> float | None:
    """The largest update/weight ratio any weight matrix had at any read (None where none was read). Not of one that
    started tiny or at zero (a LoRA's B, a zero-initialised head): any update is most of its norm (a review: such a
    head's ratio of 1 hid a run at lr 1e-7 that learned nothing)."""
    per = [v for t in engine.tracks.values() for i, (n, p) in enumerate(zip(t.names, t.params))
           if p.dim() >= 2 and not _tiny_at_start(t, i, p) for _, v in engine.ratios.get(n, ())]
    return max(per) if per else None


MOVED_LITTLE = 0.01   # of its norm, the most a weight matrix could have moved over the whole run: it learned nothing


def _barely_moved(fastest: float | None, steps: int) -> str:
    """Where even the fastest weight matrix, at its fastest read's pace every step, moves under MOVED_LITTLE of its
    norm over the run, the words that say so; else "". A sweep: Adam at lr 1e-7 on digits, updates 6e-7 of the
    weights a step, the loss at chance for 570 steps, passed with an info."""
    if fastest is None or steps < 1 or fastest * steps >= MOVED_LITTLE:
        return ""
    return (f"no weight matrix moved more than {fastest:.2g} of its norm in a step at any read, {fastest * steps:.2%} "
            f"at most over the {steps} steps")


def _later_ratio(samples: list) -> float:
    """The median update/weight ratio of the reads after the first step (all of them where there are none)."""
    return statistics.median([v for s, v in samples if s > 1] or [v for _, v in samples])


def _plateau_hint(growth: float | None, end: float, first: float, classes: int = 0, rose: bool = False,
                  floored: float | None = None) -> str:
    """A flat loss with weights grown BLOWN_GROWTH-fold that ended above half its first step's loss (the weights as
    they came: it learned little) is not a rate too small: HF Trainer's AdamW at 100x the rate (a BERT's loss 0.69 ->
    5.4 -> ~0.9, the weights 10.8x, the rate decayed to ~0 by the end) was told "converged, or the learning rate is
    too small". One that fell far is converged, however its weights grew from a tiny init (a review: 13 -> 0.087 at
    the noise floor, the weights 464x). `floored`: the weights' growth beyond a standard initialisation's scale (a
    tiny init growing to a normal scale does not count), given only where the updates still move the weights by
    UPDATING a step (a review: full-batch descent on a regression with targets of scale 10 sat at its least-squares
    optimum, the weights 38x, its updates 0); GREW-fold and more, a rate too small is not what the weights say (a
    sweep: Adam at lr 0.1 on an MLP, the weights 7x, updates 0.01 of them a step, a plateau at 0.45 where lr 1e-3
    reaches 0.11, was told the rate may be too small). `rose`: the last window's losses above the second half's first window's
    beyond their noise: not converged, and a rate too small does not lift a loss (a sweep: Adam at lr 1 on an MLP,
    87 -> 0 by mid-run, then back up to 0.24 between spikes of several hundred, was told the rate may be too small)."""
    if growth is not None and growth >= BLOWN_GROWTH and first > 0 and end > 0.5 * first:
        return (f"the weights' norm grew {growth:.3g}× over the run: updates that outgrew the weights (a learning rate "
                "too high) keep a loss from settling; lower the learning rate (10× for a start)")
    if rose:
        return ("it rose again over the second half, so it has not converged: updates too large to settle at a minimum "
                "(a learning rate too high: lower it or decay it), or an objective that changes over the run (an "
                "annealed term, a curriculum)")
    chance = (_at_chance(classes, end) or _above_chance(classes, end)).rstrip("; ")
    if not chance and floored is not None and floored >= GREW:
        return (f"converged, or held up by a learning rate too high: the weights' norm grew {floored:.3g}× over the "
                "run (beyond a standard initialisation's scale); try it 10× lower and compare")
    return chance or "converged, or the learning rate is too small"


def _held_above_first(values: list[float], med: list[float], w: int) -> bool:
    """Every running median from the first full window on at least twice the first step's loss (the weights as they
    came, before any update), or one at BLOWN_PEAK times it (a sweep: HF Trainer's GPT-2 at learning_rate=1.0, 4.01
    at step 1, a median of ~150 by step 12, back to 5.9, val loss worse than untrained and wte 100x), and the run's end above it by BLOWN_K robust standard deviations of the per-step
    log-losses about their trend (a first batch that was only a lucky one is not where the run started). The end,
    not the lowest of the medians: a climb under way in the first window (a warm-up to Adam at lr 2: 1.34, a first
    window's median of 5.1, 115 at the end, the weights 129x) put its lowest within the spread its own chaos made (a
    sweep: a warning). Losses that are never negative only. A loss of exactly 0 (a saturated cross-entropy answering
    a batch with certainty) has no place on the log scale and is left out of the spread: counted at a floor, the 48
    zeros among 300 losses of an MLP that Adam at lr 3 blew up (1.13 → a running median of 180, the weights 350x)
    widened it past the climb on one CPU and not on another."""
    if values[0] <= 0 or min(values) < 0 or med[-1] <= 0:   # ended at 0: no log (a review: math domain error)
        return False
    low = min(med[w - 1:])
    if low < 2 * values[0] and max(med[w - 1:]) < BLOWN_PEAK * values[0]:
        return False
    return math.log(med[-1] / values[0]) > BLOWN_K * _step_noise([math.log(v) for v in values if v > 0], w)


def _first_left(values: list[float], pairs, initial: float, w: int) -> str:
    """Where the first window's median, the start a climb is measured from, is far above the first loss: the blow-up
    began inside that window; its first loss and the step it first passed twice that (a sweep: "above where it started
    (4.09e+06)" for a run whose first losses were 42.8, 15.9, 472, 3138)."""
    if not values[0] > 0 or initial < 2 * values[0]:
        return ""
    j = next((j for j, v in enumerate(values) if v > 2 * values[0]), None)
    return (f", the median of its first {w} steps; its first loss was {values[0]:.4g} at step {pairs[0][0]}"
            + (f", above twice that from step {pairs[j][0]}" if j is not None else ""))


def _blown_and_back(values: list[float], med: list[float], w: int) -> bool:
    """The loss blew up, a running median (or a median of 5 steps in the first window) at BLOWN_PEAK times the first
    step's loss (the weights as they came), came down from it BLOWN_PEAK-fold and ended no lower than nine tenths of
    that first loss (a sweep: Adam at lr 1.0 on an MLP, 1.40 at step 1, 681 at step 2, back to 1.42 at chance after
    224 steps, the weights 42x, was an info plateau and a PASS). Asked only of a cross-entropy that ended at chance
    (_at_chance): a first batch that was only an easy one (a regression's 9.2 among ~400s, ending at its noise floor)
    or a target whose scale grew for a while (a critic's returns) has the same shape, and learned (a review). Ended below it, the run learned something (_plateau_hint); ended far
    above it beyond the noise, _held_above_first's error. A lucky first batch among losses spread over decades has no
    peak that came down. Losses that are never negative only."""
    if len(values) < 7 or values[0] <= 0 or min(values) < 0 or med[-1] <= 0:
        return False
    # the first window's medians of 5 too: a blow-up over its first 10 steps or so is diluted in a window of 22
    # (the same run on other seeds: 7.2, 4.4, 11.2 as the first window's median, ~100x in the steps after the first)
    early = max(statistics.median(values[k:k + 5]) for k in range(1, max(2, min(w, len(values)) - 4)))
    peak = max(early, *med[w - 1:])
    return peak >= BLOWN_PEAK * values[0] and peak >= BLOWN_PEAK * med[-1] and med[-1] >= 0.9 * values[0]


def _step_noise(logs: list[float], w: int) -> float:
    """The robust spread of each log-loss about the median of the w steps around it: the steps' own noise. The
    spread of the raw log-losses counts the run's trend as noise: Lightning's AdamW at lr 3 (1.53 at step 1, 705 at
    step 2, a slow fall to ~10, the weights 50x) spread them 1.36 against this 0.59, and passed."""
    h = w // 2
    off = [x - statistics.median(logs[max(0, i - h):i + h + 1]) for i, x in enumerate(logs)]
    centre = statistics.median(off)
    return 1.4826 * statistics.median(abs(x - centre) for x in off)


def _weight_growth(engine, floored: bool = False) -> float | None:
    """The norm of every watched parameter at the last read over the same at the first (None where not read).
    `floored`: each parameter's first norm taken at least at a standard initialisation's scale (a weight matrix's
    norm under a 1/√fan_in init is about √rows; a vector's √n, a LayerNorm's ones): weights initialised tiny (1e-3)
    that grew to a normal scale did not outgrow themselves (a review: a regression from a 1e-3 init whose first batch
    was easy, 0.08, then ~7 and a fall to 0.17, its weights 236×, was called diverged from the start)."""
    first = last = 0.0
    for t in engine.tracks.values():
        if t.start_norm is None or t.weight_norm is None or len(t.start_norm) != len(t.weight_norm):
            continue
        for p, a, b in zip(t.params, t.start_norm, t.weight_norm):
            if math.isfinite(a) and math.isfinite(b):
                scale = math.sqrt(max(1, p.shape[0] if len(p.shape) >= 2 else math.prod(p.shape)))
                first += max(a, scale) ** 2 if floored else a * a
                last += b * b
    return math.sqrt(last / first) if first > 0 else None


def _halves_flat(values: list[float]) -> bool:
    """The second half's median no lower than the first half's by more than twice the first half's standard error
    of a median (_median_se): a flat curve, whatever its batch-to-batch noise."""
    h = len(values) // 2
    first, second = values[:h], values[h:]
    return statistics.median(second) >= statistics.median(first) - 2 * _median_se(first)


UNSCALED = 100.0   # a float input this large is raw (pixels in 0..255, counts, prices), not standardised


def _unscaled(engine) -> str:
    top = engine.checks.get("input_absmax")
    if top is None or not math.isfinite(top) or top < UNSCALED:
        return ""
    return (f"the model's input reaches |x| = {top:.4g} at the first step: unless the model scales it first, normalise "
            "it (x / 255 for pixels, standardised features); ")


def _rise_during(lr_at: dict, excursion: tuple, w: int):
    """(step, from, to): the learning rate reached 1.5x its lowest over the low block or more, at its highest between
    that block and the end of the top block (first reached at `step`), and the loss was half way up its climb by then
    or soon after: within the rise's own length, or two blocks (the half way block is known to a block, and a blow-up
    lags the rate: a step x3 that takes the loss up 10x over the next 100 steps).
    - A climb that came back is a divergence only while the learning rate rose: without that, a non-stationary
      objective climbs and comes back by design (BYOL's bump, a GAN's generator as its critic learns: a review).
    - A warm-up that ended long before the climb is not it (a review), nor one the climb began long after (a healthy
      loss's slow wander, up from a low block in the warm-up, simulated: bench/watch_curves.py)."""
    low, top, _, _, mid = excursion
    before = [v for s, v in lr_at.items() if low[0] <= s <= low[1] and v is not None and v > 0]
    during = [(v, s) for s, v in lr_at.items() if low[0] <= s <= top[1] and v is not None]
    if not before or not during:
        return None
    peak = max(v for v, _ in during)
    at = min(s for v, s in during if v >= peak)
    if peak < 1.5 * min(before) or mid > at + max(2 * w, at - low[0]):
        return None
    return at, min(before), peak


def _rise_before(pairs, lr_at: dict, i: int, w: int) -> str | None:
    """The hint's words for a learning-rate rise within the w steps before pairs[i] to a rate the run never had
    before it (a warm-up to a peak too high spikes the loss and the norm just after the rise; their hints spoke of
    the batch and clipping alone; a cyclic schedule's return to a rate it trained at is no cause: a review), or None."""
    rise = _lr_rise(pairs[:i + 1], lr_at, pairs[i][0], w) if lr_at else None
    now = lr_at.get(pairs[i][0])
    if not rise or rise[0] < pairs[i][0] - w or now is None:
        return None
    before = [v for s, v in lr_at.items() if s < rise[0] and v is not None]
    if before and now <= max(before):
        return None
    return (f"the learning rate rose from {rise[1]:.3g} (step {rise[0]}) to {now:.3g}, a rate the run never had "
            f"before, {pairs[i][0] - rise[0]} step(s) before it: lower the peak learning rate (or lengthen a warm-up)")


def _explosion_hint(norms, lr_at: dict, i: int, w: int, clipped: bool) -> str:
    return _rise_or(norms, lr_at, i, w, "the loop clips gradients (the norms are clip_grad_norm_'s, before "
                    "clipping): lower the learning rate, or look at that batch" if clipped else
                    "clip gradients (torch.nn.utils.clip_grad_norm_) or lower the learning rate")


def _spike_hint(pairs, lr_at: dict, i: int, w: int, clipped: bool) -> str:
    return _rise_or(pairs, lr_at, i, w, "look at that batch; lower the learning rate (the loop clips gradients "
                    "already)" if clipped else "look at that batch; clip gradients")


def _rise_or(pairs, lr_at: dict, i: int, w: int, otherwise: str) -> str:
    """A hint naming the learning-rate rise before pairs[i] (_rise_before), else `otherwise`."""
    rise = _rise_before(pairs, lr_at, i, w)
    return f"{rise}; else look at that batch" if rise else otherwise


def _climb_hint(pairs, lr_at: dict, low_step: int, w: int) -> str:
    rise = _lr_rise(pairs, lr_at, low_step, w)
    if rise:
        return (f"the climb began after the learning rate rose from {rise[1]:.3g} to {rise[2]:.3g} at step {rise[0]}: "
                "lower the peak learning rate or lengthen the warm-up")
    return "lower the learning rate"


def _excursion_at_any(values: list[float], steps: list, w: int, spiked: int | None, lr_at: dict):
    """_excursion at the block w, else at w/2, w/4, ... (3 steps at least). A climb during a warm-up shorter than a
    block (most are: w is a tenth of the run) is smeared into the first block's median, which it raises with where the
    run started (a review's run, 4.2 -> 29 within the first 6 of 60 steps and back to 4.8, was missed on some CPUs).
    Each size has its own noise and its own count of blocks to clear, and a smaller one reads only climbs from a block
    within the first w steps that came back: all it adds is the level before a climb that began there (read anywhere,
    a slow wander of a healthy loss gave twice the warnings, simulated: bench/watch_curves.py; one held to the end is
    the error's to judge, and a loss that rose early and levelled off, a GAN generator's as its critic learns, was a
    warning: a review)."""
    size, floor = w, 0.0
    while size >= 3:
        found, noise = _excursion(values, steps, size, spiked, w if size < w else None, floor)
        floor = max(floor, noise)
        if found and (size == w or found[2]) and (rise := _rise_during(lr_at, found, size)):
            return found + (rise,)
        size //= 2
    return None


def _excursion(values: list[float], steps: list, w: int, spiked: int | None, low_within: int | None = None,
               floor: float = 0.0):
    """(found, noise). found: ((first step, last step, median) of the low block, the same of the top block, whether it
    came back, the median of the first w steps, the first step of the first block half way up the climb in log) when
    the loss climbed from one w-step block's median to a later one's as far as loss-diverged asks of a run's end,
    beyond noise (a review: AdamW at lr 1.0 under a decaying schedule, 4.3 -> 49 by step 9 and back to 5.2 at the end,
    was no finding); else None. A climb that began with a loss-spike (index `spiked`) is that finding's. The noise is the block medians'
    own over the whole run (_noise), and the climb must clear DIVERGE_K of it plus what the lowest and the highest of
    the run's blocks reach by chance. With `low_within`, the low block lies within that many first steps."""
    initial = statistics.median(values[:w])
    f = math.log if min(values) > 0 else float
    logs, noise = _block_noise(values, w, f)
    if len(logs) < 4:
        return None, 0.0
    wide, noise2 = _block_noise(values, 2 * w, f)
    if len(wide) >= 6 and math.sqrt(2) * noise2 < noise:   # periodic over two blocks: judged at twice the block
        logs, noise, w = wide, noise2, 2 * w
    else:
        noise = _noise(values, w, f)
    noise = max(noise, floor)
    n, k = len(values), len(logs)
    first = n - k * w                       # blocks aligned to the end, as _block_noise makes them
    blocks = [statistics.median(values[first + j * w:first + (j + 1) * w]) for j in range(k)]
    low, found = 0, None
    for j in range(k):
        if blocks[j] < blocks[low] and (low_within is None or first + (j + 1) * w <= low_within):
            low = j
        if _climbed(blocks[j], blocks[low], initial) and (found is None or blocks[j] > blocks[found[1]]):
            found = (low, j)
    if found is None or (spiked is not None and first + found[0] * w <= spiked <= first + (found[1] + 1) * w):
        return None, noise
    if f(blocks[found[1]]) - f(blocks[found[0]]) <= (DIVERGE_K + 2 * math.sqrt(2 * math.log(k))) * noise:
        return None, noise
    back = f(_held_top(blocks, found, initial)) - f(blocks[-1]) > DIVERGE_K * noise
    half = (f(blocks[found[0]]) + f(blocks[found[1]])) / 2
    mid = next(j for j in range(found[0], found[1] + 1) if f(blocks[j]) >= half)
    return tuple((steps[first + j * w], steps[first + (j + 1) * w - 1], blocks[j]) for j in found) + (
        back, initial, steps[first + mid * w]), noise


def _held_top(blocks: list[float], found: tuple[int, int], initial: float) -> float:
    """The level a climb held for two blocks in a row (its top block alone is the highest of several at one level, a
    lucky one), or its top where it held none above its low (a climb of one block: a review)."""
    low, top = found
    held = max((min(a, b) for a, b in zip(blocks[low:], blocks[low + 1:])), default=blocks[top])
    return held if _climbed(held, blocks[low], initial) else blocks[top]


def _diverged(last: float, best: float, initial: float) -> bool:
    """A climb (_climbed) that is not a negative loss's rise to 0 (_to_zero)."""
    return _climbed(last, best, initial) and not _to_zero(last, best)


def _climbed(last: float, best: float, initial: float) -> bool:
    """Above where it started and, for a positive loss, above twice its best. A loss that goes negative (a GAN
    critic's, -cos, -reward) has no such ratio: it must end above its start by a tenth of its scale (|start| +
    |best|): a WGAN's -0.0104 -> -0.0101 is noise, -p's -0.95 -> -0.5 (from -0.79) is not."""
    if last <= initial:
        return False
    if best > 0:
        return last > 2 * best
    return last - initial > 0.1 * (abs(initial) + abs(best))


def _to_zero(last: float, best: float) -> bool:
    """A negative loss that rose to within a tenth of its best's size of 0, from below: every term of it vanished (a
    sweep: an actor-critic's surrogate plus entropy bonus, -0.0026 -> -0.00005 as the policy grew sure, was a
    loss-diverged error on a healthy run). A maximised quantity that collapsed (a reward to 0) does the same: info."""
    return best < 0 and best * 0.1 <= last <= 0


def _climb_beyond_noise(values: list[float], w: int, last: float, extra: float = 0.0) -> bool:
    """Is the climb to the last running median more than the loss's own noise makes by chance? Per-task or
    per-sample losses (meta-learning, batch size 1) spread over decades, so the lowest of many window medians lies
    far below the typical one and the last one far above it with no trend at all (a Reptile loop's 30-step medians
    range 0.15–6 and "2× the best" was an error on 4 of 10 seeds). The noise of one window's median is measured
    from the run itself (_block_noise), and the climb, from the best level the run held for two blocks in a row (one
    lucky block is not where the run was), must clear DIVERGE_K noise scales plus what the lowest of the blocks
    reaches by chance."""
    f = math.log if min(values) > 0 else float
    logs, _ = _block_noise(values, w, f)
    if len(logs) < 4:
        return True
    held = min(max(a, b) for a, b in zip(logs, logs[1:]))
    return f(last) - held > (DIVERGE_K + extra + math.sqrt(2 * math.log(len(logs)))) * _noise(values, w, f, False)


def _noise(values: list[float], w: int, f, shrink: bool = True) -> float:
    """The noise of a difference of two w-step block medians (through f), read from the run (_block_noise).
    - A loss periodic over two blocks (SGDR's restarts, unshuffled halves) is flat at 2w: the noise there, x sqrt(2).
    - Few blocks (10 for runs of up to 500 steps): a climb's own bends are most of their second differences (a
      review: a 500x climb at the end of a 300-step run was within "noise"). Half blocks hold twice as many, and a
      median of twice the steps has less noise by the factor the half blocks' noise shrank from the quarter blocks'
      (1/sqrt(2) for independent steps; nearer 1 for a loss correlated over many steps, which a shrink assumed
      independent would call a climb). Without `shrink` (the error of a run that ends diverged) the half blocks'
      noise as it is, which a median of more steps has at most."""
    logs, noise = _block_noise(values, w, f)
    wide, noise2 = _block_noise(values, 2 * w, f)
    if len(wide) >= 6:
        noise = min(noise, math.sqrt(2) * noise2)
    if len(logs) < 40 and w >= 8:
        _, half = _block_noise(values, w // 2, f)
        _, quarter = _block_noise(values, w // 4, f)
        if half > 0 and quarter > 0:
            noise = min(noise, half * (min(1.0, max(half / quarter, 1 / math.sqrt(2))) if shrink else 1.0))
    return noise


def _block_noise(values: list[float], w: int, f) -> tuple[list[float], float]:
    """The medians of consecutive w-step blocks aligned to the end (through f: log for a positive loss), and the
    noise of a difference of two of them: the spread of their second differences, which a steady fall or climb does
    not move and one kink moves once."""
    n = len(values)
    logs = [f(statistics.median(values[n - (k + 1) * w:n - k * w])) for k in range(n // w)][::-1]
    if len(logs) < 3:
        return logs, 0.0
    second = [logs[j] - (logs[j - 1] + logs[j + 1]) / 2 for j in range(1, len(logs) - 1)]
    centre = statistics.median(second)
    return logs, math.sqrt(2) * 1.4826 * statistics.median(abs(x - centre) for x in second) / math.sqrt(1.5)


def _outside_spread(values: list[float], i: int, w: int, v: float | None = None, k: float = SPREAD_K) -> bool:
    """Is loss i far outside what the loss did over the SPREAD_STEPS·w steps before it: more than
    SPREAD_K robust standard deviations (1.4826 × the median absolute deviation) above the running median?
    In log space when the losses are positive (a loss is a ratio-scale quantity: per-sample losses at batch
    size 1 spread over decades, a batch mean's over a few percent), else in its own units. A smooth
    curve has a small spread, so the `spike` ratio decides there; a noisy one needs a much larger jump."""
    recent = values[max(0, i - SPREAD_STEPS * w):i]
    last = values[i - w:i]
    v = values[i] if v is None else v   # another value judged against the same steps (a median after a spike)
    if v > 0 and min(recent) > 0:
        f = math.log
        recent, last, v = [f(x) for x in recent], [f(x) for x in last], f(v)
    centre = statistics.median(recent)
    mad = statistics.median(abs(x - centre) for x in recent)
    return v - statistics.median(last) > k * 1.4826 * mad


def _lr_rise(pairs, lr_at: dict, best_step: int, w: int):
    """The last learning-rate rise (≥ 1.5× the lowest rate of the w steps before it) up to w steps after
    the loss's best running median (the median lags the climb by up to a window)."""
    found = None
    recent: list[float] = []
    for s, _ in pairs:
        lr = lr_at.get(s)
        if lr is None or s > best_step + w:
            continue
        low = min(recent[-w:]) if recent else None
        if low is not None and low > 0 and lr >= 1.5 * low and (found is None or s > found[0] + w):
            found = (s, low, lr)
        recent.append(lr)
    return found


def _validation(result: Result, engine, pairs) -> None:
    med = dict(zip([s for s, _ in pairs], running_medians([v for _, v in pairs], window(len(pairs))))) if pairs else {}

    def train_at(step):
        before = [s for s in med if s <= step]
        return med[before[-1]] if before else None

    unknown, worse = [], []
    for name, vals in engine.metrics.items():
        vals = [(s, float(v)) for s, v in vals if isinstance(v, (int, float)) and math.isfinite(v)]
        if len(vals) < 3 or re.search(r"(?<![a-z])train", name, re.I):   # not "constraint", "strain"
            continue
        up = _direction(name, [v for _, v in vals])
        if up is None:
            unknown.append(name)
            continue
        best = (max if up else min)(range(len(vals)), key=lambda i: vals[i][1])
        last = vals[-1][1]
        t0, t1 = train_at(vals[best][0]), train_at(vals[-1][0])
        # a training loss held at exactly 0 counts as falling: a loss against the model's own argmax is 0 from its
        # first steps while the validation loss climbs (a sweep's run passed)
        if (best <= len(vals) - 3 and _sustained(vals, best, up, name) and t0 is not None and t1 is not None
                and (t1 < t0 or t0 == t1 == 0)):
            fell = "was exactly 0" if t0 == t1 == 0 else f"fell from {t0:.4g} to {t1:.4g}" + (" (exactly 0)" if t1 == 0 else "")
            tail = [v for _, v in vals[best + 1:][-VAL_TAIL:]]   # what _sustained judged, not the last alone
            to = f"{last:.4g} (step {vals[-1][0]})" if len(tail) == 1 else (
                f"{statistics.median(tail):.4g} (median of the last {len(tail)} evaluations, {last:.4g} at step "
                f"{vals[-1][0]})")
            worse.append((name, f"{name} got worse from {vals[best][1]:.4g} (step {vals[best][0]}) to {to} while the "
                                f"training loss (running median) {fell}", t1,
                          not _improved_first(vals, best, up)))
        elif (best <= len(vals) - 3 and _sustained(vals, best, up, name) and t0 is not None and t1 is not None and t0 > 0
              and t1 > 1.5 * t0 and not any(f.code == "loss-diverged" for f in result.findings)):
            # both worse together: the run diverged, which the training loss alone did not show as far as its own
            # rule asks (a sweep: SGD at 10x the rate, 1.26 -> 2.38, back at chance, and the validation loss with it)
            result.add("loss-diverged", "warning", "", f"the training loss climbed from {t0:.4g} (running median, step "
                       f"{vals[best][0]}) to {t1:.4g} (step {vals[-1][0]}) and {name} got worse with it, from "
                       f"{vals[best][1]:.4g} to {last:.4g}", "lower the learning rate")
    # one story for the run: a validation loss that never improved on its first evaluation says nothing learned
    # carries over, and then no other metric of the run is told "overfitting" (a sweep: val_loss pointed at the
    # labels and val_acc, at chance throughout, at early stopping)
    # (a loss's: a calibration error best at the first evaluations, as a zero-initialised head's is, told an
    # overfitting run to check its labels: a review)
    never = any(first and re.search(r"loss", name, re.I) for name, _, _, first in worse)
    for name, message, end, first in worse:
        result.add("val-worsens", "warning", name, message, _val_hint(pairs, end, first or never))
    if unknown:
        more = f" and {len(unknown) - 8} more" if len(unknown) > 8 else ""
        result.notes.append(f"not judged for val-worsens, its name says no direction: {', '.join(unknown[:8])}{more} "
                            "(a name with loss/err or acc/score in it does; an ELBO above 0 may be the negated bound a loop "
                            "minimises)")


SPREAD = re.compile(r"(?<![a-z])(std|stddev|stdev|var|variance|sem|sd|iqr|mad)(?![a-z])", re.I)   # no better side


def _direction(name: str, values: list[float]) -> bool | None:
    """Is higher better (True), lower (False), or does the name tell no direction (None: not judged; a review: hits@1
    rising was "worse", and a GAN's D(real) has no better side)? Read from the name's words, camelCase read as words
    too (valAcc: val_Acc) and as written (mIoU); where a convention goes both ways its sign decides (NEGATED_LOSS,
    LIKELIHOOD)."""
    forms = (name, re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name))
    lower = any(LOWER_IS_BETTER.search(n) for n in forms)
    higher = any(HIGHER_IS_BETTER.search(n) for n in forms)
    if any(SPREAD.search(n) for n in forms) or not (lower or higher):
        return None
    if any(NEGATED_LOSS.search(n) for n in forms) and max(values) <= 0:
        return True
    up = higher and not lower
    if up and any(ELBO.search(n) for n in forms) and min(values) > 0:
        return None
    return up


def _val_hint(pairs, end: float, first_best: bool) -> str:
    """Overfitting, unless the metric was never better than at its first evaluation (beyond its noise:
    _improved_first) or the training loss itself
    hardly fell (within 10% of its first window's median): a model that learns nothing that carries over (a sweep:
    labels shuffled apart from their inputs, training loss 2.33 -> 2.26 at chance, was told to stop earlier).
    Overfitting proper improves first."""
    if end == 0:
        return ("a training loss of exactly 0 fits every batch perfectly: a margin loss can, a cross-entropy only when "
                "its target is made from the output (its argmax, a detached copy) rather than from the labels")
    start = statistics.median([v for _, v in pairs][:window(len(pairs))])
    hardly = start > 0 and end >= 0.9 * start
    if first_best or hardly:
        why = (f"the training loss hardly fell over the run (its first steps' median {start:.4g} → {end:.4g})"
               if hardly else "it, or the run's validation loss, was never better than at its first evaluation, "
               "beyond its noise")
        return (f"{why}: nothing learned carries over to it; check that each label belongs to its input (shuffled "
                "or misaligned apart) and that validation inputs are prepared as training's, before regularising")
    return "overfitting: stop earlier, add regularisation or data"


def _val_noise(v: list[float]) -> float:
    """The robust spread of each evaluation about its neighbours' mean (1.4826 x MAD: a normal's standard deviation;
    a neighbour residual's is sqrt(1.5) x the evaluations')."""
    off = [v[i] - (v[i - 1] + v[i + 1]) / 2 for i in range(1, len(v) - 1)]
    centre = statistics.median(off)
    return 1.4826 * statistics.median(abs(x - centre) for x in off) / math.sqrt(1.5)


def _improved_first(vals, best: int, up: bool) -> bool:
    """The best evaluation beats the first by more than 2% of it and twice the metric's noise: a model that learned
    something that carried over, before it overfit. A dip of 0.4% (labels shuffled apart from their inputs: eval_loss
    0.7025, 0.6996, then up to 1.44, worse than chance throughout) is noise (a sweep: "overfitting" was the hint)."""
    v = [x for _, x in vals]
    gain = (v[best] - v[0]) if up else (v[0] - v[best])
    return gain > max(0.02 * abs(v[0]), 2 * _val_noise(v))


def _sustained(vals, best: int, up: bool, name: str = "") -> bool:
    """The evaluations after the best (the last VAL_TAIL of them) are all worse than it, and their median by more
    than 2% of it and by more than the metric's own noise allows: the best of n noisy evaluations lies about
    sqrt(2 ln n) noise scales beyond their level by chance, and VAL_NOISE_K more is asked. The noise scale is the
    robust spread of each evaluation about its neighbours' mean, which a smooth curve, falling or climbing, does
    not have (an accuracy one sample up, one down, is all noise)."""
    v = [x for _, x in vals]
    worse = [(v[best] - x) if up else (x - v[best]) for x in v[best + 1:][-VAL_TAIL:]]
    noise = _val_noise(v)
    need = max(0.02 * max(abs(v[best]), 1e-12), noise * (VAL_NOISE_K + math.sqrt(2 * math.log(len(v)))))
    need = max(need, 2 * _counted_se(name, v[best], v))
    return min(worse) > 0 and statistics.median(worse) > need


ACCURACY = re.compile(r"(?<![a-z])acc(?!ess)|top\d", re.I)


def _counted_se(name: str, p: float, values: list[float]) -> float:
    """The sampling error of an accuracy counted on n samples, sqrt(p(1-p)/n), where the name says accuracy and every
    value is k/n for one n (its grid, read from the values: the smallest n up to GRID_N that fits all); else 0. The
    evaluations' scatter about each other understates it: one validation set, a model that changes a little between
    evaluations (a sweep: val_acc on 400 samples, one evaluation at 0.885 among ~0.865, scatter 0.003-0.006 against
    this 0.017, while a 28k-sample test set improved throughout, was "worse")."""
    if not ACCURACY.search(name) or not 0 <= p <= 1 or any(not 0 <= x <= 1 for x in values) or len(values) < GRID_MIN:
        return 0.0
    n = next((n for n in range(2, GRID_N + 1) if all(abs(x * n - round(x * n)) < GRID_TOL for x in values)), None)
    # a power of ten is also what rounding to decimal places leaves (a review: 10,000 samples logged as round(acc, 3)
    # read as 1000, and a real drop of 0.023 was hidden): not told apart, not used
    if n is None or math.log10(n) == round(math.log10(n)):
        return 0.0
    return math.sqrt(p * (1 - p) / n)


def _tiny_at_start(track, i: int, p) -> bool:
    """Tiny by construction at the run's start (a layer scale or register token at 1e-5, as gradflow judges it; or
    exactly zero: a GRN's gain, an attention-bias table, a zero convolution): it grows from there, so each update is
    a large part of its norm by design (timm fastvit's gammas: 0.1)."""
    start = track.start_norm[i] if track.start_norm else None
    return start is not None and p.numel() > 0 and start / p.numel() ** 0.5 < TINY_RMS


def _owners(engine) -> dict:
    """id(parameter) -> the track that stepped it last: a parameter two optimizers hold (a head's, kept in a
    variable, and the whole model's after unfreezing) is one row, with the values the later one read."""
    out: dict = {}
    for t in sorted(engine.tracks.values(), key=lambda t: t.last_step):
        for p in t.params:
            out[param_key(p)] = t
    return out


def _auxiliary(engine, t) -> bool:
    """An optimizer of no model beside one of a model (an attack's perturbation, a temperature): its tensors are
    not weights, so no update/weight band or never-gets-grad is asked of them; non-finite values still are."""
    return not t.roots and not engine.explicit_models and any(o.roots for o in engine.tracks.values())


def _layers(result: Result, engine) -> None:
    rows, owners = [], _owners(engine)
    lr_of = dict(zip(result.series["step"], result.series["lr"]))
    for t in engine.tracks.values():
        judged = not _auxiliary(engine, t)
        for i, p in enumerate(t.params):
            if owners[param_key(p)] is not t:
                continue
            samples = engine.ratios.get(t.names[i], [])
            later = [v for s, v in samples if s > 1] or [v for _, v in samples]   # (how many: len(later) below)
            ratio = _later_ratio(samples) if samples else None
            rows.append({"name": t.names[i], "shape": _shape_of(p), "update_ratio": ratio,
                         "weight_norm": t.weight_norm[i] if t.weight_norm else None, "max_grad_norm": t.grad_max[i],
                         "got_grad": _got_grad(t, i),
                         "changed": None if t.changed is None else t.changed[i]})
            if not judged:
                continue
            if ratio is not None and p.dim() >= 2 and len(later) >= 2 and ratio > engine.opts.ratio_high \
                    and not _tiny_at_start(t, i, p):
                result.add("update-ratio-high", "warning", t.names[i], f"updates of {t.names[i]} are {ratio:.3g} of its "
                           f"norm per step (median of {len(later)} read steps; sane: about 1e-3)", _high_ratio_hint(t, p, ratio))
            elif ratio is not None and p.dim() >= 2 and len(later) >= 2 and 0 < ratio < RATIO_LOW:
                result.add("update-ratio-low", "info", t.names[i], f"updates of {t.names[i]} are only {ratio:.2g} of its "
                           "norm per step", _low_ratio_hint(t, i, p, samples, lr_of))
    result.tables.append(Table("layers", "Parameters", [
        Column("name", "parameter"), Column("shape", "shape"), Column("update_ratio", "update/weight", "float"),
        Column("weight_norm", "‖w‖", "float"), Column("max_grad_norm", "max ‖grad‖", "float"), Column("got_grad", "grad"), Column("changed", "changed")],
        rows, limit=30, tb_scalars=("update_ratio",)))


SHRANK = ("converged (the loss at its floor), or dead or saturated units (often after updates too large: then lower "
          "the learning rate)")


def _low_ratio_hint(t, i: int, p, samples: list, lr_of: dict) -> str:
    """Why a weight's late updates are tiny, from what the reads saw. Where the rate fell RATE_FELL-fold since the read
    of the largest ratio: the rate, and where the update per unit of rate fell that far too, the gradient as well (a
    review: a MultiStepLR to 1e-7, the gradient steady; tanh units saturated under a cosine schedule). Where a read
    saw updates of a sane size (SANE_RATIO), or the weight grew BLOWN_GROWTH-fold (from its start, or a standard
    initialisation's scale where it started below): the rate moved it, and its gradient shrank since, which a
    converged fit does as well as dead units (a sweep: SGD warmed up to lr 1, ratios 0.04-0.1 by step 100, the weights
    11-55x, every unit dead, was told the rate may be too small; a review: a Linear regression converged to 9e-4)."""
    ratios = [v for _, v in samples]
    if samples:
        top, last = max(samples, key=lambda sv: sv[1]), samples[-1]
        then, now = lr_of.get(top[0]), lr_of.get(last[0])
        if then and now is not None and 0 <= now <= then / RATE_FELL:
            fell = (f"the learning rate fell from {then:.3g} (at a read where its updates were {top[1]:.2g} of its norm) "
                    f"to {now:.3g}")
            if now == 0 or last[1] / now >= top[1] / then / RATE_FELL:   # (a rate at 0 moves nothing at all)
                return f"{fell}: the updates shrank with it; the learning rate may be too small for this layer now"
            return f"{fell}, and its gradient shrank further still: {SHRANK}"
    if ratios and max(ratios) >= SANE_RATIO:
        return (f"its updates were {max(ratios):.2g} of its norm at a read before, so the rate moves it; its gradient "
                f"shrank since: {SHRANK}")
    a = t.start_norm[i] if t.start_norm else None
    b = t.weight_norm[i] if t.weight_norm else None
    if a is not None and b is not None and math.isfinite(a) and math.isfinite(b):
        grew = b / max(a, math.sqrt(max(1, p.shape[0])))
        if grew >= BLOWN_GROWTH:
            return (f"its norm grew {grew:.3g}× over the run: the updates were large before they got small, so its "
                    f"gradient shrank since: {SHRANK}")
    return "the learning rate may be too small for this layer"


def _high_ratio_hint(t, p, ratio: float) -> str:
    """Weight decay that alone makes half the ratio or more is named: SGD at weight_decay 1.0 (a sweep: ratios 0.53,
    accuracy 0.30 against 0.99) was told to lower the learning rate. Its shrink a step is lr x weight_decay where it is
    decoupled (AdamW), over 1 - momentum for SGD; Adam's coupled decay goes through its normalised step, which this
    does not measure (a review), and keeps the learning-rate hint."""
    opt = t._opt()
    group = next((g for g in getattr(opt, "param_groups", []) if any(q is p for q in g["params"])), None) or t.group
    try:
        lr, decay = float(group.get("initial_lr", group.get("lr"))), float(group.get("weight_decay") or 0.0)
    except (TypeError, ValueError):
        return "lower the learning rate"
    if t.kind == "SGD" and not group.get("nesterov") and 0 <= group.get("momentum", 0) < 1:
        shrink = lr * decay / (1 - group.get("momentum", 0))
    elif t.kind == "AdamW" or group.get("decoupled_weight_decay"):
        shrink = lr * decay
    else:
        return "lower the learning rate"
    if shrink >= 0.5 * ratio:
        return (f"weight_decay {decay:g} at lr {lr:g} alone moves the weights by {shrink:.3g} of their norm a step: "
                "lower weight_decay (about 5e-4 with SGD, 0.01-0.1 with AdamW)")
    return "lower the learning rate"


def _got_grad(t, i: int):
    """A gradient at a read step, or a non-zero gradient norm at any step (an optimizer that never stepped at a
    read step, a task's copy trained for 5 steps between reads: its maximum is known, its presence was not looked
    at); None when neither says."""
    if t.seen_grad[i] or t.grad_max[i] > 0:
        return True
    return False if t.sampled else None


def _dead(result: Result, engine) -> None:
    dead = {name: samples for name, samples in engine.checks["dead"].items()
            if len(samples) >= 3 and _newly_dead(samples[-1], _alive_at_first(samples))}
    feeds = engine.checks.get("dead_feeds", {})
    regrouped = engine.checks["dead_regrouped"]
    roots = {name: _dead_root(name, dead, feeds) for name in dead}
    for name, samples in dead.items():
        if roots[name] != name:   # a pool or flatten passing on the dead units of a layer before it
            continue
        if name in regrouped:   # a layer's output regrouped (a Flatten's units are a channel at one position: a border
            continue            # that sees only zeros goes dark while the channel lives; bench/bugs so_47352366)
        passed = [n for n, r in roots.items() if r == name and n != name]
        step, newly, _, _, units = samples[-1]
        after = f"; passed on by {', '.join(passed)}" if passed else ""
        alive = int(_alive_at_first(samples))
        were = (f"alive at step {samples[0][0]}," if newly >= DEAD_SHARE * units else   # or the layer is all dead
                f"all {int(newly)} that were non-zero at step {samples[0][0]}, the other {units - alive} zero on its "
                "batch already; no unit of it non-zero now,")
        message = (f"{int(newly)} of {units} units of {name} went dead over the run ({were} "
                   f"zero for every sample of the batches read at steps {samples[-2][0]} and {step}{after})"
                   + _dead_since(samples))
        came = int(engine.checks.get("dead_arrived", {}).get(name, 0))   # stats._input_range
        if newly and came >= newly / 2:   # most: a dropout in train mode also zeroes a unit alive in a few samples
            inside = name.rsplit(".", 1)[0] if "." in name else "the model"
            which = "they were" if came >= newly else f"{came} of them were"
            message += (f"; {which} zero at its input already: {name} has no parameters and passes them on from code "
                        f"of {inside} that is not a module (an activation called as a function)")
        # a layer left with (almost) no live units passes (almost) nothing on: a loss that falls after is the rest of
        # the model's (an output bias fitting an offset), not the layer's spare capacity (a review)
        still = units - samples[-1][2]
        spared = _trained_on(result, _alive_until(samples)) if still >= SPARED_ALIVE * units else None
        if spared:
            result.add("dead-units", "info", name, f"{message}; {spared}")
        else:
            result.add("dead-units", "warning", name, message,
                       _unscaled(engine) + "lower the learning rate, or use LeakyReLU/GELU")


def _dead_since(samples) -> str:
    """When the layer's units went dead: the first two reads in a row that found at least half of those dead at the
    end dead already, where that is earlier than the last two (a sweep: SGD at lr 1 killed 58 of 64 by step 50; the
    finding named only the reads at steps 201 and 251)."""
    final = samples[-1][1]
    j = next((j for j in range(1, len(samples)) if samples[j][1] >= max(DEAD_SHARE * final, 1)), len(samples) - 1)
    if j >= len(samples) - 1:
        return ""
    return (f"; {int(samples[j][1])} of its units dead already at the reads of steps {samples[j - 1][0]} and "
            f"{samples[j][0]}")


def _newly_dead(sample, alive: float) -> bool:
    """At least DEAD_SHARE of a layer's units (4 or more, never negative) alive at its first sample and dead at this
    read and the one before (stats._collect); or, where no unit of the layer is non-zero at this read, DEAD_SHARE of
    the `alive` ones, 2 at least: a layer 40 of 64 zero on its first batch (inputs of scale 2000) whose other 24 died
    passes nothing on, and was not said (a sweep). Not of those alive alone: at batch size 1 a unit that fires on a
    fifth of the samples is zero at two reads most of the time (a review: 7 of the 7 alive on the first sample)."""
    _, newly, dead, nonneg, units = sample
    if not nonneg or units < 4:
        return False
    return newly >= DEAD_SHARE * units or (dead >= units and newly >= max(2, DEAD_SHARE * alive))


def _alive_at_first(samples) -> float:
    """The units alive at a layer's first sample (all of them where its unit count changed since)."""
    first, last = samples[0], samples[-1]
    return first[4] - first[2] if first[4] == last[4] else last[4]


def _alive_until(samples) -> int | None:
    """The step of the last read that saw the units alive, before their final stretch of dead reads (None: dead from
    the first read). A read counts units dead there and at the read before (stats._collect), so the read before the
    stretch saw them dead already: the one before that is the last alive."""
    alive = _alive_at_first(samples)
    for i in range(len(samples) - 1, -1, -1):
        if not _newly_dead(samples[i], alive):
            return samples[max(i - 1, 0)][0]
    return None


def _trained_on(result: Result, alive: int | None) -> str | None:
    """What training did after the units died, when it went on without them: the median loss of the last
    SPARED_READS steps at most SPARED_FALL × the median of the SPARED_READS steps up to the last read that saw them
    alive, and no non-finite loss since (the network had the capacity to spare; a run the death stalled, or set back
    for good, keeps its loss above that). None otherwise."""
    if alive is None:
        return None
    if any(v is not None and not math.isfinite(v) for s, v in zip(result.series["step"], result.series["loss"])
           if s >= alive):
        return None   # a loss that went non-finite since: the run did not go on well
    pairs = _finite_pairs(result.series["step"], result.series["loss"])
    before = [v for s, v in pairs if s < alive][-SPARED_READS:]   # the read's own step is after the update before it
    later = [v for s, v in pairs if s >= alive]
    if len(before) < 2 or len(later) < SPARED_READS:
        return None
    then, now = statistics.median(before), statistics.median(later[-SPARED_READS:])
    if not (then > 0 and now <= SPARED_FALL * then):
        return None
    return (f"training went on without them: the loss fell from {then:.4g} (median of the steps before step {alive}, "
            f"whose read was the last to see them alive) to {now:.4g} (median of the last {SPARED_READS} steps)")


def _dead_root(name: str, dead: dict, feeds: dict) -> str:
    """The earliest dead module up the chain of parameter-free modules that fed `name` (itself when none)."""
    root, source, seen = name, feeds.get(name), {name}
    while source is not None and source not in seen:
        seen.add(source)
        root = source if source in dead else root
        source = feeds.get(source)
    return root


def _verdict(result: Result, engine, interrupted, failure) -> None:
    errors = [f for f in result.findings if f.severity == "error"]
    warnings = [f for f in result.findings if f.severity == "warning"]
    if interrupted:
        result.code = int(interrupted)
        result.verdict = f"INTERRUPTED after {engine.step} step(s): the report covers the steps up to then"
    elif failure:
        result.verdict = f"STOPPED at step {engine.step}: {failure}"
    elif engine.broken:   # a bug of ours: never a PASS over the steps it did not watch (a sweep: PASS, exit 0)
        from ...errors import ExitCode

        result.code = int(ExitCode.INTERNAL)
        found = f"; before it: {errors[0].code}" if errors else f"; before it: {len(warnings)} warning(s)" if warnings else ""
        result.verdict = f"INCOMPLETE: watch stopped watching at step {engine.step} after an internal error in torchdiag " \
                         f"(please report it){found}"
    elif errors:
        result.verdict = f"FAIL: {errors[0].code}" + (f" at {errors[0].where}" if errors[0].where else "")
    elif warnings:
        result.verdict = f"WARN: {len(warnings)} warning(s) in {engine.step} steps"
    else:   # an info is no fault, yet "nothing wrong" under "the loss never fell" read as a contradiction (a sweep)
        infos = sorted({f.code for f in result.findings if f.severity == "info"})
        result.verdict = f"PASS: {engine.step} steps, nothing wrong found" + (
            f" (info: {', '.join(infos)})" if infos else "")


def _gone_bad(result: Result) -> str:
    """The finite medians hid a run whose last ~250 losses were NaN (a sweep): how many were not finite, from when."""
    pairs = [(s, v) for s, v in zip(result.series["step"], result.series["loss"]) if v is not None]
    bad = [s for s, v in pairs if not math.isfinite(v)]
    return f" finite steps; {len(bad)} of {len(pairs)} steps non-finite, the first at step {bad[0]}" if bad else " steps"


def _optimizers(engine) -> list[str]:
    """Each watched optimizer (as it is now, or as it was when the run let it go); a new one each epoch over the
    same parameters is the same line; those of no model that were let go (an attack's) are counted."""
    out = []
    # under a schedule the rate now is its last (a sweep: "AdamW (lr 0)" after a decay to 0 read as a setup error);
    # the summary gives the run's range
    lrs = [v for v in engine.series.get("lr", []) if v is not None]
    for t in (t for t in engine.tracks.values() if not t.retired):
        lr = t.lr()
        if not isinstance(lr, (int, float)):
            out.append(t.kind)
            continue
        # each optimizer by its own rates (a sweep: a teacher at one rate was said "after the last step" for the
        # student's schedule, and ReduceLROnPlateau's cut after the last step was not said); the clock's series
        # spans the optimizers made anew over the run
        seen = (lrs if t is engine.clock and lrs else []) + ([*t.rates[:2], lr] if t.rates else [])
        moved = len(seen) > 1 and max(seen) - min(seen) > 1e-6 * max(abs(v) for v in seen)
        out.append(f"{t.kind} (lr {lr:g}{' after the last step' if moved else ''})")
    if engine.let_go:
        out.append(f"{engine.let_go} optimizer(s) of no model not reported (let go by the run, or stepped before a "
                   "model's optimizer first did)")
    if engine.one_offs:
        out.append(f"{engine.one_offs} optimizer(s) let go with their model after one step (a model made anew each "
                   "step) not listed; their steps are counted")
    return out


def _shape_of(p) -> str:
    """A parameter's shape as said; a lazy module's never called has none yet (a review: asking raised)."""
    return "uninitialised (a lazy module never called)" if is_uninitialised(p) else "x".join(map(str, p.shape)) or "scalar"
