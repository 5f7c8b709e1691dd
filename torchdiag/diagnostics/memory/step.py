"""The tracked step: one steady-state training step (or inference forward) on a model we own, with
every live tensor storage booked by category (core/memtrack.py). Used alike on real and fake tensors."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from ...core.op_dtypes import OpDtypes
from ...core.run import autocast_dtype
from ...core.train import backward, step
from ...errors import ModelError, UsageError


@dataclass
class StepReport:
    method: str
    peak: int
    peak_phase: str
    peak_modules: tuple
    at_peak: dict[str, int]
    phase_peaks: dict[str, int]
    phase_at_peak: dict[str, dict[str, int]]
    param_bytes: int
    buffer_bytes: int
    input_bytes: int
    grad_bytes: int
    optimizer_bytes: int
    activation_bytes: int
    modules: list
    cuda: dict[str, Any] | None = None
    snapshot: bytes | None = None       # CUDA allocator history (pickle), when asked
    op_dtypes: Any = None               # core.op_dtypes counts of the step, when asked (--amp/--dtype)
    loss: str | None = None             # the loss the training step took (header and JSON, as other commands)


def unique(ts):
    return list({id(t): t for t in ts}.values())


def _state_tensors(opt):
    import torch

    return [v for st in opt.state.values() for v in st.values() if isinstance(v, torch.Tensor)]


def nbytes(tensors) -> int:
    from ...core.memtrack import storages

    seen = {}
    for t in tensors:
        for st in storages(t):
            seen[st._cdata] = int(st.nbytes())
    return sum(seen.values())


def _steady_optimizer(trainable, ctx, emulate: str):
    """The run's optimizer with its state already created (as from step 2 on): one zero-gradient step."""
    import torch

    # foreach is torch's default on CUDA; single-tensor on CPU. Estimates for meta model CUDA's choice.
    opt = ctx.optimizer(trainable, foreach=emulate in ("cuda", "meta"))
    for p in trainable:
        p.grad = torch.zeros_like(p)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return opt


def run_step(model, inputs, opts, ctx, *, emulate: str, round_to: int = 1, method: str = "",
             real: bool = False) -> StepReport:
    """One tracked step on `model` (a copy we own, on its final device/dtype) with `inputs`. `real`:
    real tensors on the run's device: the run's own autocast, and the dtype each compute op ran in."""
    from ...core.memtrack import make_tracker
    from ...core.tracking import ModuleTracker

    train = opts.mode == "train"
    params = unique(model.parameters())
    trainable = [p for p in params if p.requires_grad]
    buffers = unique(model.buffers())
    model.train(train)
    opt = None
    if train:
        if not trainable:
            raise UsageError("the model has no trainable parameters: nothing to train",
                             hint=f"use {ctx.option('mode')} inference")
        opt = _steady_optimizer(trainable, ctx, emulate)
    # a model fully_shard sharded frees and re-allocates storages in place: the tracker re-reads sizes
    tracker = make_tracker(round_to, resizable=real and ctx.spec.wrap == "fsdp")
    for p in params:
        tracker.register(p, "parameters")
    for b in buffers:
        tracker.register(b, "buffers")
    for _, t in inputs.tensors():
        tracker.register(t, "inputs")
    for t in (_state_tensors(opt) if opt is not None else []):
        tracker.register(t, "optimizer_state")
    sizes = {"param_bytes": nbytes(params), "buffer_bytes": nbytes(buffers),
             "input_bytes": nbytes([t for _, t in inputs.tensors()]),
             "optimizer_bytes": nbytes(_state_tensors(opt)) if opt is not None else 0,
             "grad_bytes": 0, "activation_bytes": 0}
    names = ModuleTracker(model)
    tracker.watch_modules(model)
    if train:
        tracker.watch_grads(trainable)
    on_cuda = emulate == "cuda" and any(p.is_cuda for p in params[:1])
    loss_rule = _loss_rule(ctx, inputs) if train else None
    amp_ctx = ctx.autocast() if real else _amp(ctx.spec.amp, on_cuda)
    dtypes = OpDtypes(model) if real and (ctx.autocast_dtype or ctx.spec.dtype) else contextlib.nullcontext()
    try:
        with dtypes:
            _tracked(model, inputs, tracker, names, amp_ctx, loss_rule, opt, trainable, sizes)
    finally:
        tracker.remove_hooks()
    return StepReport(
        method=method, peak=int(tracker.peak), peak_phase=tracker.peak_phase,
        peak_modules=tracker.peak_modules, at_peak={k: int(v) for k, v in tracker.peak_by_cat.items() if v},
        phase_peaks=dict(tracker.phase_peak), phase_at_peak={k: dict(v) for k, v in tracker.phase_peak_by_cat.items()},
        modules=[m for m in tracker.modules.values() if m.calls], op_dtypes=getattr(dtypes, "seen", None),
        loss=loss_rule.describe() if loss_rule is not None else None, **sizes)


def _tracked(model, inputs, tracker, names, amp_ctx, loss_rule, opt, trainable, sizes: dict) -> None:
    """forward (+ loss, backward, optimizer step) under the tracker; fills the byte counts in `sizes`."""
    import torch

    from ...core.tracking import forward_error

    train = opt is not None
    inputs.keep()   # the copy a forward that writes into its input is re-run from: not the model's memory
    with tracker, names, torch.autograd.graph.saved_tensors_hooks(tracker.pack, tracker.unpack):
        with contextlib.ExitStack() as stack:
            if not train:
                stack.enter_context(torch.no_grad())
            tracker.set_phase("forward")
            try:
                with amp_ctx:
                    out = inputs.call(model)
            except (UsageError, ModelError):
                raise
            except Exception as exc:
                raise forward_error(exc, names) from exc
            if train:
                with amp_ctx:
                    loss = loss_rule(out)
            tracker.attribute_activations()
            sizes["activation_bytes"] = int(tracker.by_cat.get("activations", 0))
            if train:
                tracker.set_phase("backward")
                if not backward(loss, "the model's backward raised; check custom autograd functions"):
                    raise ModelError("backward failed: the loss does not require grad (no trainable parameter reaches it)")
                tracker.end_backward()
                sizes["grad_bytes"] = nbytes([p.grad for p in trainable if p.grad is not None])
                tracker.set_phase("optimizer")
                step(opt)
                sizes["optimizer_bytes"] = nbytes(_state_tensors(opt))
            del out
            if train:
                del loss


def _amp(amp: str | None, on_cuda: bool):
    """Autocast for the estimate's fake CPU tensors (emulating the device: auto is fp16 on CUDA)."""
    import torch

    dtype = autocast_dtype(amp, "cuda" if on_cuda else "cpu")
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type="cuda" if on_cuda else "cpu", dtype=getattr(torch, dtype))


def _loss_rule(ctx, inputs):
    """A fresh loss rule; a --batch target resized along dim 0 to the inputs' batch size (estimates at
    other sizes)."""
    import torch

    rule = ctx.loss()
    target, bs = rule.target, inputs.batch_size
    if isinstance(target, torch.Tensor) and bs is not None and target.dim() > 0 and target.shape[0] != bs:
        rule.target = torch.zeros((bs,) + tuple(target.shape[1:]), dtype=target.dtype, device=target.device)
    return rule
