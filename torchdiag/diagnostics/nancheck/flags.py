"""The flagged pass: what a healthy model pays. Per module call, the sum of each floating output is
kept on the device (NaN/Inf survive a sum); after backward the loss, those sums and the parameter
gradients' batched norms are read back in ONE host sync (per device). Only when something is
non-finite does `localized_pass` run the exact checked pass (checked.py) to name the culprit.

Why a second pass rather than localising from the flags: by the time the flags are read, the
module outputs are freed or changed in place (inplace ReLU), and keeping them alive would pin every
activation of the step. The second pass starts from the same RNG state, buffers and (cleared)
gradients, so it sees the same values; it costs one more forward+backward, only on a broken model."""
from __future__ import annotations

import math

from ...core.distributed import local_shard
from ...core.readback import read_back
from ...core.tracking import Call, ForwardHooks, describe, float_ids
from .checked import PassReport, checked_pass, forward_loss_backward
from .finite import (
    device_sum,
    flatten,
    floating_inputs,
    is_float,
    scalar_totals,
    totals,
)

_Tensor = None


class FlagChecker(ForwardHooks):
    """A forward hook on every module that queues one device-side sum per floating output (no sync)."""

    pre_kwargs = True

    def __init__(self, model, outer=None):
        import torch

        global _Tensor
        _Tensor = torch.Tensor
        super().__init__(model)
        self.sums: list = []      # 0-dim tensors, in completion order
        self.calls = 0
        self.outer = outer        # a wrapper of ours (DDP): its call is not one of the model's
        self._open: list = []     # (module, args, kwargs) of calls still running: to name one that raises
        self._last = None         # (tensor, version): a parent returning its child's output is summed once

    def _pre(self, mod, args, kwargs):
        if mod is not self.outer:
            self.calls += 1
        self._open.append((mod, args, kwargs))

    def _post(self, mod, args, output):
        if self._open:
            self._open.pop()
        if type(output) is _Tensor:   # the common case, fast
            self.add(output)
        else:
            for _, t in flatten(output, "output", []):
                self.add(t)

    def add(self, t) -> None:
        if not is_float(t):
            return
        last = self._last
        if last is not None and last[0] is t and last[1] == t._version:
            return
        self.sums.append(device_sum(t))
        self._last = (t, t._version)

    @property
    def failing(self) -> Call | None:
        """For tracking.forward_error: the innermost module still open after an exception."""
        if not self._open:
            return None
        mod, args, kwargs = self._open[-1]
        name = self.names.get(id(mod), "?")
        shapes = describe(tuple(t for _, t in floating_inputs(args, kwargs)))
        return Call(name, type(mod).__name__, name.count(".") + 1 if name else 0, inputs=shapes,
                    float_ids=float_ids(mod, args))


def flagged_pass(model, inputs, loss_fn, *, backward: bool = True, autocast=None, watch=None,
                 saw=None, outer=None) -> PassReport | None:
    """One forward (+ loss + backward), fills .grad of `model`. The report of a healthy pass, or None
    when anything (a module output, the loss, a parameter gradient) may be non-finite.
    `watch` (precision.Watch, reduced precision only) adds its magnitudes to the same read-back; `saw(loss)` is
    told the graph before its backward (forward_loss_backward); `outer` is a wrapper of ours whose call is not
    counted as one of the model's."""
    checker = FlagChecker(model, outer) if watch is None else watch.checker(model)
    try:
        output, loss, backward_ran, note = forward_loss_backward(model, inputs, loss_fn, checker, backward, autocast,
                                                                 saw)
    finally:
        if watch is not None:
            watch.remove_hooks()
    for _, t in flatten(output, "output", []):   # the model output (the root's, summed once)
        checker.add(t)
    if loss.numel() != 1:
        float(loss.detach())   # the same error as the exact pass gives
    grads = [local_shard(p.grad) for p in model.parameters() if p.grad is not None]   # fsdp: this rank's shard
    flags = [loss.detach(), *scalar_totals(checker.sums), *totals(grads)]
    extra = watch.scalars(model) if watch is not None else []
    values = read_back(flags + extra)   # one sync per device
    if watch is not None:
        watch.take(values[len(flags):])
        values = values[:len(flags)]
    if not all(math.isfinite(v) for v in values):
        return None
    return PassReport(checker.calls, [], None, [], values[0], loss_fn.describe(), True, False, None, [], [],
                      len(grads), backward_ran, note)


def rng_state(device):
    """The CPU RNG state, and the device's own when it has one (dropout on CUDA draws from it)."""
    import torch

    cuda = torch.cuda.get_rng_state(device) if device is not None and device.type == "cuda" else None
    return torch.random.get_rng_state(), cuda


def set_rng_state(state, device) -> None:
    import torch

    cpu, cuda = state
    torch.random.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state(cuda, device)


def localized_pass(model, inputs, loss_fn, reset=None, device=None, autocast=None, watch=None, saw=None) -> PassReport:
    """The flagged pass (`saw`: flagged_pass's); when it finds anything non-finite, the exact pass again from the same
    state (RNG, buffers via `reset`, no .grad) to name the forward culprit; and when only a gradient is
    non-finite, once more with gradient hooks on every module to name the backward culprit."""
    state = rng_state(device)
    rep = flagged_pass(model, inputs, loss_fn, autocast=autocast, watch=watch, saw=saw)
    if rep is not None:
        return rep

    def again():
        for p in model.parameters():
            p.grad = None
        if reset is not None:
            reset()
        set_rng_state(state, device)

    again()
    rep = checked_pass(model, inputs, loss_fn, track_grads=False, autocast=autocast)
    if rep.backward_ran and rep.param_grad_rows and rep.origin is None and not rep.output_bad and rep.loss_finite:
        again()
        rep = checked_pass(model, inputs, loss_fn, track_grads=True, autocast=autocast)
        rep.localized = True
    return rep
