"""nancheck: where numbers first go non-finite (NaN/Inf) — inputs, parameters, forward, loss, backward.

One forward+backward on the user's model (train mode, buffers restored afterwards), checked in order:
model inputs; parameters and buffers; the output of every module in execution order (forward
hooks); the loss; gradients in backward order; parameter gradients.

A healthy model costs a constant number of host syncs however deep it is: finiteness is kept on the
device and read back once (flags.py); only when something is non-finite does the exact pass
(checked.py) run to name the first module whose output is non-finite while its inputs were finite,
and the first whose input gradient turns non-finite while the gradient at its output was finite.

`--steps N` trains a copy (never the user's model) on the same batch (steps.py); `--anomaly` repeats
the pass under autograd anomaly detection and captures the forward trace of the failing backward op
(anomaly.py). Findings and tables are built in report.py; the torch-free Options are in options.py."""
from __future__ import annotations

from ...core.guard import leave_no_trace, restore_buffers, snapshot_buffers
from ...core.masks import additive_mask
from ...results import Result
from .anomaly import anomaly_pass, parse_frames, report_anomaly
from .checked import Checker, PassReport, checked_pass
from .finite import (
    all_finite,
    counts,
    finite,
    flatten,
    is_float,
    shape_text,
)
from .flags import flagged_pass, localized_pass, rng_state, set_rng_state
from .options import NEEDS_VALUES, OPTIMIZER, WRAP, Options
from .precision import Watch
from .precision_report import check_precision
from .report import (
    backward_finite,
    filled,
    fills_note,
    finite_pass,
    report_pass,
    report_tensors,
)
from .scaled import report_scaled, train_scaled
from .steps import report_steps, train_until_non_finite
from .wrapped import report_reduced, wrapped_pass

__all__ = ["Options", "run", "NEEDS_VALUES", "OPTIMIZER", "WRAP", "all_finite", "finite", "counts", "flatten",
           "parse_frames", "checked_pass", "flagged_pass", "localized_pass", "Checker", "PassReport"]


def nonfinite_tensors(model, inputs, target=None) -> tuple[list, list]:
    """Rows of non-finite model inputs (the batch's target too) and of non-finite parameters/buffers: one sync when
    all are finite."""
    named_inputs = [(name, t) for name, t in inputs.tensors() if is_float(t)]
    # a sweep: a NaN in the target was "the loss function itself produced it" (a tuple or dict target's tensors too)
    targets = flatten(target, "target", []) if target is not None else []
    named_inputs += targets
    state = [(kind, name, t) for kind, items in (("parameter", model.named_parameters()),
                                                  ("buffer", model.named_buffers())) for name, t in items if is_float(t)]
    if all_finite([t for _, t in named_inputs] + [t for _, _, t in state]):
        return [], []

    def row(name, kind, t):
        nan, inf = counts(t)
        out = {"tensor": name, "kind": kind, "shape": shape_text(t), "nan": nan, "inf": inf}
        if kind == "input" and additive_mask(t):
            out["additive_mask"] = True   # read by report_tensors, not a column
        return out

    given = len(named_inputs) - len(targets)
    as_target = {id(t) for _, t in targets}   # an input that is also the target (HF's labels=) is judged as the target
    return ([row(name, "target" if i >= given else "input", t) for i, (name, t) in enumerate(named_inputs)
             if not finite(t) and (i >= given or id(t) not in as_target)],
            [row(name, kind, t) for kind, name, t in state if not finite(t)])


IGNORE_INDEX = -100   # cross-entropy's default ignore_index (torch and transformers)


def _all_ignored(result, inputs, loss_fn) -> None:
    """A non-finite loss or output, and an integer input (or target) whose every value is -100: a cross-entropy
    averaged over no target is 0/0 = NaN (a sweep: GPT-2 given labels all -100 was told to look at log/sqrt in its
    forward). Said in the finding's hint; one read per integer tensor, only when something went non-finite."""
    bad = [f for f in result.findings if f.code in ("non-finite-output", "non-finite-loss") and f.severity == "error"]
    if not bad:
        return
    # where a cross-entropy took them: the model's own loss is the first non-finite output (a review: an int input
    # of -100 added to a sqrt's NaN was named), or torchdiag's cross-entropy took them as its target
    out = (result.data.get("forward") or {}).get("output")
    # the model's own loss: its 'loss' key, or the scalar output the auto loss took as it (return_dict=False: a review)
    own = out == "output['loss']" or (getattr(loss_fn, "chosen", "") == "model" and out == loss_fn.picked)
    ce = getattr(loss_fn, "chosen", "") == "cross_entropy" and loss_fn.target is not None
    named = (list(inputs.tensors()) if own else []) + ([("the target", loss_fn.target)] if ce else [])
    import torch

    ignored = [n for n, t in named if isinstance(t, torch.Tensor) and not t.is_floating_point() and t.numel()
               and t.dtype != torch.bool and bool((t == IGNORE_INDEX).all())]
    if ignored:
        words = (f"every value of {ignored[0]} is {IGNORE_INDEX}, cross-entropy's ignore_index: a loss averaged over "
                 "no target is 0/0 = NaN; give the batch at least one real label (the padding or masking left none)")
        for f in bad:
            f.hint = words


def _passes(model, inputs, loss_fn, opts: Options, ctx, state, watch=None):
    """The pass on the user's model in train mode (buffers, grads, flags, RNG put back), and the
    anomaly pass from the same RNG state when asked: (PassReport, anomaly dict or None)."""
    import torch

    amp = ctx.autocast if ctx.precision.amp else None
    with leave_no_trace(model):
        saved = snapshot_buffers(model)
        try:
            for p in model.parameters():
                p.grad = None
            model.train()
            torch.set_grad_enabled(True)
            report = localized_pass(model, inputs, loss_fn, reset=lambda: restore_buffers(saved), device=ctx.device,
                                    autocast=amp, watch=watch, saw=lambda loss: ctx.saw_activations(loss, model, inputs))
            anomaly = None
            if opts.anomaly:
                for p in model.parameters():
                    p.grad = None
                restore_buffers(saved)
                set_rng_state(state, ctx.device)
                anomaly = anomaly_pass(model, inputs, loss_fn, amp)
        finally:
            restore_buffers(saved)
    return report, anomaly


def run(model, inputs, opts: Options, ctx) -> Result:
    optimizer = ctx.spec.optimizer
    result = Result("nancheck", header={"mode": "train mode, one forward+backward (buffers restored)"}, ordered=True)
    if opts.anomaly:
        result.header["anomaly_mode"] = "also run under torch.autograd.detect_anomaly(check_nan=True)"
    if opts.steps:
        result.header["training"] = (f"{opts.steps} × {optimizer.name} (lr={optimizer.learning_rate:g}) "
                                     "on a copy, same batch" + (", fp16 autocast with a GradScaler" if ctx.precision.scaled else ""))
    loss_fn = ctx.loss()   # one rule for every pass: its random target is drawn once
    tensors = nonfinite_tensors(model, inputs, ctx.batch_target)   # before any pass touches the model
    state = rng_state(ctx.device)
    watch = Watch() if ctx.precision.reduced else None
    wrapped, reduced = wrapped_pass(model, inputs, loss_fn, ctx, state)   # under torchrun --wrap ddp only
    if wrapped and reduced is not None and watch is None and not opts.anomaly:
        report, anomaly = reduced, None    # healthy after the reduction: no local pass needed
    else:
        report, anomaly = _passes(model, inputs, loss_fn, opts, ctx, state, watch)
    if report.loss_desc:
        result.header["loss"] = report.loss_desc
    # the target is the data's when the loss is non-finite from a finite output (a review: a model's own NaN was
    # headlined as the target's, a masked missing label beside it)
    made = report.origin is not None and not report.origin.inputs_finite   # a NaN a module made of a mask's -inf
    fill = filled(report, ctx)   # the forward's ±Inf are constants the model writes (core/fills.py)
    report_tensors(result, *tensors, finite_pass=finite_pass(report), loss_finite=report.loss_finite,
                   output_finite=not report.output_bad, mask_made=made,
                   carried=ctx.fills().harmless if fill is not None and backward_finite(report) else set(),
                   overflow=ctx.overflow)
    if (why := fills_note(report, ctx)) is not None:
        result.notes.append(why)
    report_pass(result, report, fill, frozenset(ctx.overflow))
    _all_ignored(result, inputs, loss_fn)
    if wrapped:
        report_reduced(result, reduced is not None)
    check_precision(result, model, inputs, loss_fn, ctx, report, watch, state)
    if anomaly is not None:
        report_anomaly(result, anomaly)
    else:
        result.data["anomaly"] = None

    if not opts.steps:
        result.data["steps"] = None
        result.data["loss_per_step"] = None
    elif ctx.precision.scaled:   # the GradScaler's own story: does it rescue the non-finite steps?
        report_scaled(result, train_scaled(model, inputs, loss_fn, ctx, opts.steps, fill), opts.steps, optimizer)
    elif any(f.severity == "error" for f in result.findings):
        result.notes.append("--steps skipped: values are already non-finite before any optimizer step")
        result.data["steps"] = {"requested": opts.steps, "ran": 0, "first_non_finite_step": None}
        result.series["loss_per_step"] = []
    else:
        report_steps(result, train_until_non_finite(model, inputs, loss_fn, ctx, opts.steps, fill), opts.steps,
                     optimizer)

    failed = [f for f in result.findings if f.severity == "error"]
    if failed:
        result.verdict = f"FAIL: {failed[0].code} at {failed[0].where or '(model)'}"
    else:
        result.verdict = "PASS: no NaN or Inf in inputs, parameters, forward outputs, loss or gradients"
        if opts.steps:
            result.verdict += f" (and none in {opts.steps} optimizer steps)"
    return result
