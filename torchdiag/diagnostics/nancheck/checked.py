"""The exact checked pass: every module call's inputs and outputs decided on the spot (one host sync
per distinct tensor version), and, with `track_grads`, every module input/output gradient in backward
order. It names the culprits; it runs only after the flagged pass (flags.py) found something
non-finite, so a healthy model never pays its syncs.

Forward culprit: the first module (in completion order, so the innermost) whose output holds NaN or
Inf while every floating input it received was finite. Backward culprit: the first module whose
gradient w.r.t. its inputs (or, for a module whose inputs need no gradient, its own parameters) is
non-finite while the gradient arriving at its outputs was finite."""
from __future__ import annotations

import math
import weakref
from dataclasses import dataclass, field

from ...core import train
from ...core.masks import additive_mask
from ...core.output_facts import output_facts, storage_ptr
from ...core.tracking import Call, ForwardHooks, describe, float_ids, forward_error
from ...errors import ModelError
from .finite import (
    all_finite,
    counts,
    finite,
    flatten,
    floating_inputs,
    shape_text,
    value_range,
)

BACKWARD_HINT = "the model's own code raised in backward; run with --anomaly or --debug"
NO_GRAD_NOTE = "the loss does not require grad (no trainable parameter reached it): backward skipped"


@dataclass
class CallRecord:
    index: int                 # pre-hook (execution) order
    name: str
    type: str
    depth: int
    inputs: list = field(default_factory=list)    # [(label, tensor, version)]
    inputs_finite: bool = True
    inputs_nan_free: bool = True   # its non-finite inputs are additive masks (0 / -inf), no NaN, no +Inf
    made_nan: bool = False         # its output's NaN was made here, from finite or mask inputs
    in_keys: list = field(default_factory=list)
    out_keys: list = field(default_factory=list)
    done: int = -1             # completion order
    bad_outputs: list = field(default_factory=list)   # [(label, nan, inf)]
    input_range: tuple = (None, None)
    input_note: str = ""
    out_ptr: int = 0           # its first output tensor's storage (which call made the model's output)


@dataclass
class PassReport:
    modules_checked: int
    calls: list                    # CallRecords (the exact pass only; [] from a healthy flagged pass)
    origin: CallRecord | None
    output_bad: list               # [(label, nan, inf)] of the model output
    loss_value: float | None
    loss_desc: str
    loss_finite: bool
    output_grad_bad: bool          # gradient arriving at the model output is non-finite
    backward_origin: dict | None   # {name, type, via, nan, inf}
    backward_rows: list
    param_grad_rows: list          # [{parameter, shape, nan, inf}]
    grads_checked: int
    backward_ran: bool
    backward_note: str = ""
    localized: bool = False
    output_note: str = ""          # a loss non-finite from a finite output: what the output held (output_facts)


class Checker(ForwardHooks):
    """Forward hooks on every module: finiteness of inputs and outputs; tensor hooks on every
    module input/output that needs a gradient: finiteness of the gradients in backward order."""

    pre_kwargs = True
    origin: CallRecord | None = None

    def __init__(self, model, track_grads: bool):
        super().__init__(model)
        self.track_grads = track_grads
        self.calls: list[CallRecord] = []
        self._stack: list[CallRecord] = []
        self._tensor_handles: list = []
        self._seen: dict[int, tuple] = {}        # id -> (weakref, version, finite)
        self._grad_keys: dict[tuple, tuple] = {}   # (id, version) -> (slot, weakref to the tensor)
        self.grad_events: list = []              # slot -> (order, finite, nan, inf) once fired
        self._order = 0
        self.completed = 0

    def remove_tensor_hooks(self):
        for h in self._tensor_handles:
            h.remove()
        self._tensor_handles.clear()

    def known_finite(self, t) -> bool:
        entry = self._seen.get(id(t))
        if entry is not None and entry[0]() is t and entry[1] == t._version:
            return entry[2]
        ok = finite(t)
        try:
            self._seen[id(t)] = (weakref.ref(t), t._version, ok)
        except TypeError:
            pass
        return ok

    def _grad_slot(self, t) -> int | None:
        if not t.requires_grad:
            return None
        key = (id(t), t._version)
        entry = self._grad_keys.get(key)
        if entry is not None and entry[1]() is t:
            return entry[0]
        # new, or a freed tensor's id reused by another (a module's output that nothing saved for backward)
        slot = len(self.grad_events)
        self.grad_events.append(None)
        self._grad_keys[key] = (slot, weakref.ref(t))
        self._tensor_handles.append(t.register_hook(self._make_grad_hook(slot)))
        return slot

    def _make_grad_hook(self, slot):
        def hook(grad):
            if grad is None or self.grad_events[slot] is not None:
                return None
            ok = finite(grad)
            nan, inf = (0, 0) if ok else counts(grad)
            self.grad_events[slot] = (self._order, ok, nan, inf)
            self._order += 1
            return None
        return hook

    def _pre(self, mod, args, kwargs):
        name = self.names.get(id(mod), "?")
        rec = CallRecord(len(self.calls), name, type(mod).__name__, name.count(".") + 1 if name else 0)
        ok = nan_free = True
        for label, t in floating_inputs(args, kwargs):
            if not self.known_finite(t):
                ok = False
                nan_free = nan_free and additive_mask(t)   # 0 / -inf only: a non-finite input, rare, one read
            rec.inputs.append((label, t, t._version))
            if self.track_grads:
                slot = self._grad_slot(t)
                if slot is not None:
                    rec.in_keys.append(slot)
        rec.inputs_finite, rec.inputs_nan_free = ok, nan_free
        self.calls.append(rec)
        self._stack.append(rec)

    def _post(self, mod, args, output):
        if not self._stack:
            return
        rec = self._stack.pop()
        rec.done = self.completed
        self.completed += 1
        outs = flatten(output, "output", [])
        rec.out_ptr = storage_ptr(outs[0][1]) if outs else 0
        for label, t in outs:
            if not self.known_finite(t):
                rec.bad_outputs.append((label, *counts(t)))
            if self.track_grads:
                slot = self._grad_slot(t)
                if slot is not None:
                    rec.out_keys.append(slot)
        # a NaN out of inputs holding no NaN is made here, -inf among them or not (softmax over a row every key of
        # which an additive mask set to -inf: a sweep's GPT-2 was blamed on its mask, the NaN never traced)
        made = rec.inputs_finite or (rec.inputs_nan_free and any(nan for _, nan, _ in rec.bad_outputs)
                                     and not any(c.made_nan for c in self.calls[rec.index + 1:]))
        rec.made_nan = made and any(nan for _, nan, _ in rec.bad_outputs)
        # (a call inside it that made the NaN from finite or mask inputs is where it arose; one that only passed the
        # mask's -inf on, a mask's reshaping or an added bias, is not: reviews)
        if rec.bad_outputs and made and self.origin is None:
            self.origin = rec
            _input_range(rec)
        # inputs are only needed until the call ends
        rec.inputs = [(label, None, v) for label, _, v in rec.inputs] if rec is not self.origin else rec.inputs

    @property
    def failing(self) -> Call | None:
        """For tracking.forward_error: the innermost module still open after an exception."""
        if not self._stack:
            return None
        rec = self._stack[-1]
        given = tuple(t for _, t, _ in rec.inputs if t is not None)
        return Call(rec.name, rec.type, rec.depth, inputs=describe(given),
                    float_ids=float_ids(self.model.get_submodule(rec.name), given) if rec.name else None)

    def release(self):
        """Drop references to tensors (keep the origin's input range only)."""
        self._seen.clear()
        for rec in self.calls:
            rec.inputs = []


def _input_range(rec: CallRecord) -> None:
    """The origin's input range (finite elements), or a note when the module changed an input in place."""
    lo = hi = None
    for label, t, version in rec.inputs:
        if t._version != version:
            rec.input_note = f"{label} was modified in place by the module"
            continue
        a, b = value_range(t)
        if a is not None:
            lo = a if lo is None else min(lo, a)
            hi = b if hi is None else max(hi, b)
    rec.input_range = (lo, hi)


def forward_loss_backward(model, inputs, loss_fn, hooks, backward: bool, autocast=None, saw=None):
    """The model's forward under `hooks`, the loss and its backward: (output, loss, backward_ran, note).
    `autocast()` (--amp) wraps the forward and the loss, not the backward (torch's advice). A failure
    is the model's (exit 3) and names the module that raised. `saw(loss)` before the backward (what its graph
    keeps: Context.saw_activations)."""
    import contextlib

    import torch

    amp = autocast() if autocast is not None else contextlib.nullcontext()
    with amp:
        with hooks:
            try:
                output = inputs.call(model)
            except ModelError:
                raise
            except Exception as exc:
                raise forward_error(exc, hooks) from exc
        loss = loss_fn(output)
    if backward and torch.is_grad_enabled() and loss.requires_grad:
        if saw is not None:
            saw(loss)
        train.backward(loss, BACKWARD_HINT)
        return output, loss, True, ""
    return output, loss, False, NO_GRAD_NOTE if backward else ""


def param_grad_rows(model) -> tuple[int, list]:
    """(parameters with a gradient, rows of those whose gradient is non-finite): one sync when healthy."""
    grads = [(name, p) for name, p in model.named_parameters() if p.grad is not None]
    rows = []
    for name, p in ([] if all_finite(p.grad for _, p in grads) else grads):
        if not finite(p.grad):
            nan, inf = counts(p.grad)
            rows.append({"parameter": name, "shape": shape_text(p), "nan": nan, "inf": inf})
    return len(grads), rows


def checked_pass(model, inputs, loss_fn, *, backward: bool = True, track_grads: bool = True, autocast=None) -> PassReport:
    """One forward (+ loss + backward) with every module hooked; fills .grad of `model`.
    track_grads: also hook every module input/output gradient (backward culprit)."""
    import torch

    checker = Checker(model, backward and track_grads and torch.is_grad_enabled())
    try:
        output, loss, backward_ran, note = forward_loss_backward(model, inputs, loss_fn, checker, backward, autocast)
    finally:
        checker.remove_tensor_hooks()
    output_bad = [(label, *counts(t)) for label, t in flatten(output, "output", []) if not finite(t)]
    loss_value = float(loss.detach())
    root = next((c for c in checker.calls if c.name == ""), None)
    events = checker.grad_events
    out_grad_bad = False
    if root is not None and backward_ran:
        out_grad_bad = any(not e[1] for e in (events[s] for s in root.out_keys) if e is not None)
    checked, param_rows = param_grad_rows(model)
    rows, origin = backward_culprit(checker.calls, events, param_rows) if backward_ran else ([], None)
    facts = output_note(output, checker.calls, loss_value) if not math.isfinite(loss_value) and not output_bad else ""
    checker.release()
    return PassReport(len(checker.calls), checker.calls, checker.origin, output_bad, loss_value, loss_fn.describe(),
                      math.isfinite(loss_value), out_grad_bad, origin, rows, param_rows, checked, backward_ran, note,
                      output_note=facts)


def output_note(output, calls, loss: float | None = None) -> str:
    """A loss non-finite from a finite output: core.output_facts of its first floating output, with the module that made
    it (the last call whose output is the model's)."""
    t = next((t for _, t in flatten(output, "output", []) if t.numel()), None)
    ptr = storage_ptr(t) if t is not None else 0
    maker = max((c for c in calls if c.name and ptr and c.out_ptr == ptr), key=lambda c: c.done, default=None)
    return output_facts(t, f"{maker.name} ({maker.type})" if maker else None, loss)


def backward_culprit(calls, events, param_rows) -> tuple[list, dict | None]:
    """(rows of modules whose input gradient is non-finite, in backward order; the origin): the first
    whose output gradient was finite, or, for a module whose inputs need no gradient, its parameters."""
    bad_params_by_module: dict[str, list] = {}
    for r in param_rows:
        mod_name = r["parameter"].rsplit(".", 1)[0] if "." in r["parameter"] else ""
        bad_params_by_module.setdefault(mod_name, []).append(r)
    rows, candidates = [], []
    for rec in calls:
        outs = [events[s] for s in rec.out_keys if events[s] is not None]
        if not outs:
            continue
        bad_in = [e for e in (events[s] for s in rec.in_keys) if e is not None and not e[1]]
        out_ok = all(e[1] for e in outs)
        if bad_in:
            via, order = "inputs", min(e[0] for e in bad_in)
            nan, inf = sum(e[2] for e in bad_in), sum(e[3] for e in bad_in)
        elif out_ok and rec.name in bad_params_by_module and not rec.in_keys:
            # inputs need no gradient (first layer): its own parameters tell
            prows = bad_params_by_module[rec.name]
            via, order = "parameters", max(e[0] for e in outs) + 0.5
            nan, inf = sum(r["nan"] for r in prows), sum(r["inf"] for r in prows)
        else:
            continue
        rows.append({"module": rec.name or "(root)", "type": rec.type, "order": order, "grad_out_finite": out_ok,
                     "nan": nan, "inf": inf, "via": via, "_depth": rec.depth})
        if out_ok:
            candidates.append((order, -rec.depth, rec.name, rec.type, via, nan, inf))
    rows.sort(key=lambda r: (r["order"], -r["_depth"]))
    if not candidates:
        return rows, None
    order, _, name, kind, via, nan, inf = min(candidates)
    return rows, {"name": name, "type": kind, "via": via, "nan": nan, "inf": inf}
