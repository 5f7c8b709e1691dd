"""doctor: the silent-killer checklist — bugs that let a model train while doing the wrong thing.

Independent checks, one module each, every one ending in a row of the checklist (check, result,
verdict, where, hint) and, when something is wrong, a finding with a stable code naming the module
or parameter:

  device_spread, device_meta  device-mismatch   parameters/buffers on several devices; a tensor made in
                                                forward without a device (found on meta, no GPU needed)
  inplace       inplace-autograd   backward fails because a tensor saved for backward was edited in place
  modes         mode-dependent     Dropout/BatchNorm-family modules make train and eval outputs differ
  batchnorm     batchnorm-batch-1  BatchNorm in train mode with a batch of 1 raises
                batchnorm-momentum running statistics mostly the last batch's (momentum ≥ 0.5), or never moved
  determinism   nondeterministic-eval  two eval forwards on the same input differ
  update        param-not-updated  a parameter has .grad but one optimizer step leaves it unchanged
  update        update-rounds-away  bf16/fp16 weights whose update rounds away (most elements with a
                                   non-zero gradient unchanged after the step; warning; core/rounding.py)
  frozen        frozen             requires_grad=False parameters, listed by module (info)
  dtypes        dtype-mismatch     parameters of mixed floating dtypes; float inputs of another dtype
  input_stats   non-finite-input, unnormalised-input (image-like float input in [0, 255])
  edits         edits-input        the forward writes into its own input tensors in place (warning)
  target        target-out-of-range (class targets vs the output width), softmax-before-cross-entropy
  wrapped       param-hook-dropped  under torchrun --wrap fsdp: gradient hooks on parameters fully_shard drops

`checklist` holds the row/finding bookkeeping, `training` the train-mode pass, `shared` the helpers.
Under --amp the forwards and the loss run under autocast (fp16: the backward is scaled and the step
goes through a GradScaler). Everything that runs the model works on a copy; the user's model is only read. On meta (or a model
partly on meta) the static checks and the device check run, the checks that need values are skipped.
Under torchrun --wrap ddp|fsdp the training checks run on the wrapped copy (wrapped.py, WRAP in options.py)."""
from __future__ import annotations

from ...core.guard import leave_no_trace
from ...core.input_scale import weighted_inputs
from ...core.tracking import ModuleTracker, describe, forward_error
from ...errors import ModelError, one_line
from ...results import Column, Result, Table
from .batchnorm import bn_batch1_probe, bn_momentum, one_sample_erased
from .checklist import VALUE_CHECKS, Checklist, verdict
from .determinism import check_determinism
from .device_meta import check_device_meta
from .device_spread import check_device_spread
from .dtypes import check_dtypes, check_promotion
from .edits import check_edits
from .frozen import check_frozen, frozen_groups
from .input_stats import input_stats, raw_pixels
from .modes import dropout_rate, fresh_statistics, mode_modules
from .options import NEEDS_VALUES, OPTIMIZER, WRAP, Options
from .probe import Probe
from .shared import failing_call, mixes_devices_or_dtypes, name, workspace
from .target import check_probabilities, check_target
from .training import train_checks
from .wrapped import Gate
from .wrapped import make as make_wrapped

__all__ = ["Options", "NEEDS_VALUES", "OPTIMIZER", "WRAP", "run", "frozen_groups", "mode_modules"]


def run(model, inputs, opts: Options | None, ctx) -> Result:
    result = Result("doctor")
    ck = Checklist(result)
    loss = ctx.loss()
    # under torchrun --wrap ddp|fsdp: the exchange every rank makes before the wrapped training checks
    gate = Gate(ctx, result) if ctx.pass_wrapper is not None and _has_values(model, inputs, ctx) else None
    try:
        with leave_no_trace(model):
            _run(model, inputs, ctx, loss, ck, result, gate)
    except BaseException as exc:   # the model's sys.exit too; Ctrl-C/SIGTERM reach every rank themselves
        if gate is not None and not isinstance(exc, KeyboardInterrupt):
            gate.cross(True)   # a peer must not wait for this rank in the wrapped pass (no-op once crossed)
        if not isinstance(exc, ModelError):
            raise
        _partial(exc, ck, result)
        raise
    return result


def _partial(exc, ck: Checklist, result: Result) -> None:
    if result.tables and result.tables[0].key == "checks":
        result.tables[0] = ck.table()
    else:
        result.tables.insert(0, ck.table())
    exc.partial = exc.partial or result


def _run(model, inputs, ctx, loss, ck: Checklist, result: Result, gate=None) -> None:
    check_device_spread(model, ck)
    main_dtype = check_dtypes(model, inputs, ck)
    frozen_rows = check_frozen(model, ck)
    stats, raw = input_stats(inputs, ck)
    check_device_meta(model, inputs, ctx.factory, ck, _real_device_hint(ctx))

    result.tables.append(ck.table())  # replaced at the end; keeps the slot first
    result.tables.append(Table("input_stats", "Inputs", [
        Column("input", "input"), Column("shape", "shape"), Column("dtype", "dtype"), Column("min", "min", "float"),
        Column("max", "max", "float"), Column("mean", "mean", "float"), Column("std", "std", "float"),
        Column("non_finite", "non-finite", "count")], stats))
    if frozen_rows:
        result.tables.append(Table("frozen_params", "Frozen parameters by module", [
            Column("module", "module"), Column("params", "params", "count"), Column("frozen", "frozen")],
            frozen_rows))
    if _has_values(model, inputs, ctx):
        with workspace(model, ctx.spec.optimizer) as work:
            raw_pixels(stats, raw, weighted_inputs(work, inputs, ctx, raw[0][2]) if raw else None, ck)
            _value_checks(work, inputs, ctx, loss, main_dtype, ck, result, gate)
            check_edits(work, inputs, ck)
    else:
        raw_pixels(stats, raw, None, ck)
        ck.skip(VALUE_CHECKS, "model or inputs on meta: no values to run")
    result.tables[0] = ck.table()
    result.verdict = verdict(result)


def _has_values(model, inputs, ctx) -> bool:
    """Not on meta: neither the run's device nor any parameter, buffer or input (a model the Python
    API hands us may be partly on meta while its first parameter is not)."""
    if ctx.on_meta:
        return False
    held = [*model.parameters(), *model.buffers(), *(t for _, t in inputs.tensors())]
    return not any(t.device.type == "meta" for t in held)


def _value_checks(work, inputs, ctx, loss, main_dtype, ck: Checklist, result: Result, gate=None) -> None:
    ready = _eval_checks(work, inputs, ctx, loss, main_dtype, ck, result)
    # on the weights as given, before the training checks move them (a trained copy's units can die)
    erased = one_sample_erased(work, inputs) if ready is not None else None
    if gate is not None and gate.cross(ready is None):
        if ready is not None:   # a peer stopped before the training checks: this rank runs them unwrapped
            train_checks(Probe(work, inputs, ctx, ready[1], ck, result, eval_out=ready[0]))
            _after_training(work, inputs, ready[1], ck, result, erased)
        return
    if ready is None:
        return
    eval_out, train_loss = ready
    wrapped = make_wrapped(work, ctx, result) if gate is not None else None
    train_checks(Probe(work, inputs, ctx, train_loss, ck, result, eval_out=eval_out, wrapped=wrapped,
                       fresh_bn=fresh_statistics(work)))
    _after_training(work, inputs, train_loss, ck, result, erased)


def _eval_checks(work, inputs, ctx, loss, main_dtype, ck: Checklist, result: Result):
    """The eval-mode checks (on this rank's own copy under torchrun); (eval output, the loss the training
    checks use), or None when the eval forward fails as predicted."""
    ran, eval_out = _eval_forward(work, inputs, ctx, ck, result)
    if not ran:
        return None
    check_promotion(eval_out, main_dtype, ck)
    result.data["output"] = describe(eval_out)
    with ctx.autocast():   # both eval forwards as the train-mode pass runs them (modes compares them)
        check_determinism(work, inputs, ck)
    target = ctx.batch_target if ctx.batch_target is not None else loss.target
    train_loss = loss
    if check_target(eval_out, loss, target, ck):
        train_loss = ctx.loss("auto")
        result.notes.append("training checks used random class targets: the given targets are out of range")
    check_probabilities(eval_out, loss, ck)
    return eval_out, train_loss


def _after_training(work, inputs, train_loss, ck: Checklist, result: Result, erased=None) -> None:
    if train_loss.chosen:
        result.header["loss"] = train_loss.describe()
    bn_batch1_probe(work, inputs, ck, erased)
    bn_momentum(work, ck)
    dropout_rate(work, ck)


def _eval_forward(work, inputs, ctx, ck: Checklist, result: Result):
    """(True, output) of the eval forward; (False, None) when it fails as the device/dtype checks predict."""
    import torch

    work.eval()
    tracker = ModuleTracker(work, record_shapes=True)
    try:
        with torch.no_grad(), tracker, ctx.autocast():
            return True, inputs.call(work)
    except Exception as exc:
        call, module, args = failing_call(tracker, work)
        if not _predicted(ck, call, module, args):
            result.tables[0] = ck.table()
            raise forward_error(exc, tracker, "forward (eval mode)", partial=result) from exc
        result.add("forward-fails", "error", name(call.name if call else ""),
                   f"the forward pass fails as the checks above predict: {one_line(exc, 200)}",
                   "fix the findings above")
        ck.skip(VALUE_CHECKS, "forward fails (see device/dtype findings)")
        return False, None


def _predicted(ck: Checklist, call, module, args) -> bool:
    """The device/dtype checks found an error, and the forward failed where they point: in a module
    they blame (or inside one), or in a call whose tensors span several devices or dtypes."""
    if not ck.has_error("device", "dtype"):
        return False
    where = call.name if call else None
    blamed = where is not None and any(s == "" or where == s or where.startswith(s + ".") for s in ck.suspects)
    return blamed or mixes_devices_or_dtypes(module, args)


def _real_device_hint(ctx) -> str:
    """How to run for real values, in the caller's terms (the Python API uses the model's own device)."""
    if ctx.spec.caller == "python":
        return "move the model to cuda"
    return f"run with {ctx.option('device')} cuda"
