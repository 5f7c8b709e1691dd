"""The train-mode pass (stochastic depth off, as in gradflow's judged pass): one forward (train/eval
modes, BatchNorm at this batch size, in-place on a leaf), backward (in-place edits of saved tensors),
one optimizer step (parameters update). Under torchrun --wrap ddp|fsdp (`wrapped`) the pass runs on the
wrapped copy when the forward and the backward run on every rank (agreed); otherwise every rank runs it
on its own copy, as without a wrapper (wrapped.py)."""
from __future__ import annotations

from dataclasses import replace

from ...core import train
from ...core.design import stochastic_depth_off
from ...core.local_leaves import CODE as LOCAL_CODE
from ...core.local_leaves import HINT as LOCAL_HINT
from ...core.local_leaves import describe_leaf, local_leaves
from ...core.local_leaves import message as local_message
from ...core.tracking import ModuleTracker, forward_error
from ...core.unreached import (
    NO_GRAD,
    NO_GRAD_HINT,
    NO_GRAD_SEVERITY,
    no_grad_message,
    top_module,
)
from ...errors import ModelError, out_of_memory
from ...results import Result
from .batchnorm import one_value_per_channel, report_train_failure, two_samples
from .inplace import leaf_inplace_watch, locate_inplace, report_inplace
from .modes import check_modes
from .probe import Probe
from .shared import failing_call, finite, name
from .update import update_check
from .wrapped import ranks_text, report_dropped_hooks

BACKWARD_HINT = "the model's own code raised in backward; run with --debug for the traceback"


def train_checks(probe: Probe) -> None:
    """The train-mode pass on probe.work (on the wrapped copy first when probe.wrapped is set)."""
    import torch

    if probe.wrapped is not None and _wrapped_checks(probe):
        return
    # --amp fp16: the backward is scaled, the step goes through it; the checks on this rank's own copy
    probe = replace(probe, scaler=probe.ctx.grad_scaler(), wrapped=None)
    work, ctx = probe.work, probe.ctx
    work.train()
    off = _depth_off(work, probe.result)
    for p in work.parameters():
        p.grad = None
    tracker = ModuleTracker(work, record_shapes=False)
    watch = leaf_inplace_watch()
    probe = replace(probe, rng=torch.random.get_rng_state())
    try:
        with torch.enable_grad(), tracker, watch, ctx.autocast():
            out = probe.inputs.call(work)
    except Exception as exc:
        retry = _forward_failed(probe, exc, tracker, watch)
        if retry is not None:   # a batch of 1 BatchNorm refuses: the other checks run on a batch of 2
            train_checks(replace(probe, inputs=retry))
        return
    check_modes(work, probe.eval_out, out, probe.ck, probe.result, off, probe.fresh_bn)
    if _backward(probe, out):
        probe.ck.row("inplace", "ok", "backward runs")
        update_check(probe)


def _depth_off(model, result: Result) -> int:
    # a random whole-branch drop would make the gradient checks depend on the draw (gradflow's rule)
    dropped = stochastic_depth_off(model)
    note = f"stochastic depth off for the training checks ({len(dropped)} module(s))"
    if dropped and note not in result.notes:
        result.notes.append(note)
    return len(dropped)


def _wrapped_checks(probe: Probe) -> bool:
    """The train-mode pass on the wrapped copy; True when it ran. False when a rank's forward (or loss)
    or backward failed: the ranks agree on that after each, so none waits in a collective a peer skips,
    and the caller runs the checks on each rank's own copy (which classifies the failure)."""
    import torch

    w, ctx, result = probe.wrapped, probe.ctx, probe.result
    w.model.train()
    off = _depth_off(w.user, result)
    report_dropped_hooks(w, result)
    scaler = ctx.grad_scaler()
    out = value = None
    try:
        with torch.enable_grad(), ctx.autocast():
            out = probe.inputs.call(w.model)
            value = probe.loss(out)
        ready = bool(getattr(value, "requires_grad", False))
    except Exception:
        ready = False
    if _fall_back(w, not ready, "train-mode forward", result):
        return False
    try:
        train.backward(scaler.scale(value) if scaler is not None else value, hint=BACKWARD_HINT)
        failed = False
    except ModelError:
        failed = True
    if _fall_back(w, failed, "backward", result):
        return False
    check_modes(w.user, probe.eval_out, out, probe.ck, result, off, probe.fresh_bn)
    probe.ck.row("inplace", "ok", "backward runs")
    update_check(replace(probe, work=w.user, scaler=scaler))
    return True


def _fall_back(w, failed: bool, what: str, result: Result) -> bool:
    """Agree across ranks whether `what` failed anywhere (also when the loss has no graph); a note when so."""
    ranks = w.failing(failed)
    if ranks:
        result.notes.append(f"the training checks ran on this rank's own copy, not the wrapped one: the {what} "
                            f"failed (or had nothing to train) on {ranks_text(ranks)}")
    return bool(ranks)


def _forward_failed(probe: Probe, exc, tracker, watch):
    """Classify a failed train-mode forward by what is known about it (the failing module and what it
    received; the in-place op the watch saw raise). Returns inputs to retry with, or None."""
    inputs, ck = probe.inputs, probe.ck
    call, module, args = failing_call(tracker, probe.work)
    where = call.name if call else ""
    batch = inputs.batch_size
    if one_value_per_channel(module, args):
        report_train_failure(ck, call, batch)
        doubled = two_samples(inputs, probe.ctx.seed) if batch == 1 and getattr(probe.loss, "target", None) is None \
            else None
        if doubled is not None:
            probe.result.notes.append("batch size 1 fails in train mode: the other training checks ran on a batch "
                                "of 2 (the sample and a perturbed copy)")
            return doubled
    elif watch.refused is exc:
        report_inplace(ck, where, call.type if call else "?", None, "", exc)
    else:
        raise forward_error(exc, tracker, "forward in train mode") from exc
    ck.skip(("modes", "inplace", "update"), f"train-mode forward fails ({name(where)})")
    return None


def _backward(probe: Probe, out) -> bool:
    """Backward from the loss (scaled under --amp fp16); True when it ran. A failure whose cause a
    watching forward finds (a saved tensor edited in place) is the in-place finding; any other is the
    model's error (exit 3)."""
    work, ck, scaler = probe.work, probe.ck, probe.scaler
    with probe.ctx.autocast():
        value = probe.loss(out)
    if not getattr(value, "requires_grad", False):
        # no graph to run backward through: nothing trainable reached the loss
        trainable = [n for n, p in work.named_parameters() if p.requires_grad]
        why = ("no trainable parameters" if not trainable else
               "the loss does not depend on any trainable parameter (no grad_fn)")
        hint = "" if not trainable else "see torchdiag gradflow for where the graph is cut (detached output)"
        ck.row("inplace", "skipped", why, hint=hint)
        if trainable:   # every trainable parameter gets no gradient: the no-grad error
            ck.find("update", NO_GRAD, NO_GRAD_SEVERITY, top_module(trainable, work),
                    no_grad_message(trainable, len(trainable)) + f" ({why})", NO_GRAD_HINT,
                    verdict=f"none of {len(trainable)} trainable parameter tensor(s) gets a gradient")
        else:
            ck.row("update", "skipped", why)
        return False
    _local_weights(probe, value)
    _nonfinite_loss(probe, out, value)
    probe.ctx.saw_activations(value, work, probe.inputs)   # what later copies' backward keeps as well
    try:
        train.backward(scaler.scale(value) if scaler is not None else value, hint=BACKWARD_HINT)
    except ModelError as err:
        # a backward out of memory is not an in-place edit: another forward to locate one would only run out too,
        # and say so in its own words (a zoo row: efficientnet_b7's doctor named "locating the in-place edit")
        if out_of_memory(err) or not locate_inplace(work, probe.inputs, ck, err.__cause__ or err):
            raise
        ck.row("update", "skipped", "backward fails (see in-place check)")
        return False
    return True


def _local_weights(probe: Probe, value) -> None:
    """local-weight (error): leaves with requires_grad the loss reaches that are not the model's parameters."""
    leaves = local_leaves(value, probe.work, [t for _, t in probe.inputs.tensors()])
    if leaves:
        probe.result.data["local_weights"] = [describe_leaf(t) for t in leaves]
        probe.ck.find("update", LOCAL_CODE, "error", "", local_message(leaves), LOCAL_HINT,
                      verdict=f"{len(leaves)} weight(s) made in forward are not parameters: no optimizer sees them")


def _nonfinite_loss(probe: Probe, out, value) -> None:
    """non-finite-loss (error): the train-mode forward or its loss is already NaN/Inf before any step, so
    whatever the update does next is a consequence, not the optimizer's fault."""
    if bool(value.detach().isfinite().all()):
        return
    probe.nonfinite = True
    what = "the train-mode output holds NaN/Inf" if not finite(out) else "the loss is NaN/Inf from a finite output"
    probe.ck.find("update", "non-finite-loss", "error", "", f"{what} before any optimizer step: the parameters' "
                  "update is not checked (a step from a non-finite loss says nothing of the optimizer)",
                  "run `torchdiag nancheck` on this model to find the first module (or loss) with a non-finite value",
                  verdict=f"{what}: not an optimizer problem")
