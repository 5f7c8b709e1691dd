"""nancheck: where numbers first go non-finite (NaN/Inf) — inputs, parameters, forward, loss, backward.

One forward+backward on the user's model (train mode, buffers restored afterwards), checked in order:
model inputs; parameters and buffers; the output of every module in execution order (forward
hooks); the loss; gradients in backward order (tensor hooks on every module's inputs and outputs);
parameter gradients.

Forward culprit: the first module (in completion order, so the innermost) whose output holds NaN or
Inf while every floating input it received was finite. Backward culprit: the first module whose
gradient w.r.t. its inputs (or, for a module whose inputs need no gradient, its own parameters) is
non-finite while the gradient arriving at its outputs was finite.

Finiteness is decided with one `sum` per tensor (NaN and Inf survive a sum) and confirmed with an
exact `isfinite` only when the sum is not finite; each tensor version is checked once, so a
parent module's output that is its last child's output costs nothing more.

`--steps N` trains a deep copy (never the user's model) on the same batch and reports the step and
the place where values first go non-finite. `--anomaly` repeats the pass under autograd anomaly
detection and captures the forward trace of the failing backward op."""
from __future__ import annotations

import copy
import math
import re
import weakref
from dataclasses import dataclass, field
from typing import Any

from ..core.guard import leave_no_trace, restore_buffers, snapshot_buffers
from ..core.tracking import Call, ForwardHooks, forward_error
from ..errors import ModelError, UsageError, one_line
from ..results import Column, Result, Table

OPTIMIZERS = ("sgd", "adam", "adamw")
MAX_ROWS = 50
_Tensor = None


@dataclass
class Options:
    loss: Any = None            # core.loss.Loss (t.loss()); None: sum of the primary output
    steps: int = 0
    lr: float = 0.01
    optimizer: str = "sgd"
    anomaly: bool = False
    seed: int = 0


# ---------------------------------------------------------------------------------------------
# finiteness of one tensor


def _is_float(t) -> bool:
    return t.is_floating_point() or t.is_complex()


_FULL: tuple = ()


def _init_dtypes():
    global _FULL
    import torch

    _FULL = (torch.float32, torch.float64)


def finite(t) -> bool:
    """True when every element is finite. One reduction; the exact test only on suspicion."""
    import torch

    if not _FULL:
        _init_dtypes()
    d = t.detach()
    if d.dtype in _FULL:
        if math.isfinite(d.sum().item()):
            return True
    elif d.is_complex():
        return bool(torch.isfinite(d).all())
    elif math.isfinite(d.sum(dtype=torch.float32).item()):  # float16/bfloat16/float8: sum in float32
        return True
    if d.numel() == 0:
        return True
    return bool(torch.isfinite(d).all())  # a huge finite sum can overflow: decide exactly


def all_finite(tensors) -> bool:
    """True when every element of every tensor is finite, with ONE host sync for the lot (a sum of
    per-tensor float32 sums: NaN/Inf anywhere survives it). On suspicion (or mixed devices, complex
    values) each tensor is decided exactly by `finite`, so the answer is never wrong, only slower."""
    import torch

    ts = [t.detach() for t in tensors if t.numel()]
    if not ts:
        return True
    if len({t.device for t in ts}) == 1 and not any(t.is_complex() for t in ts):
        total = torch.stack([t.sum(dtype=torch.float32) for t in ts]).sum()
        if math.isfinite(total.item()):
            return True
    return all(finite(t) for t in ts)


def counts(t) -> tuple[int, int]:
    """(NaN count, Inf count)."""
    import torch

    d = t.detach()
    return int(torch.isnan(d).sum()), int(torch.isinf(d).sum())


def value_range(t) -> tuple[float | None, float | None]:
    """(min, max) over the finite elements."""
    import torch

    d = t.detach()
    if d.is_complex():
        d = d.abs()
    d = d[torch.isfinite(d)]
    if d.numel() == 0:
        return None, None
    return float(d.min()), float(d.max())


def flatten(obj, label: str, out: list, depth: int = 0) -> list:
    """(label, tensor) for every floating tensor in a nested output."""
    import torch

    if isinstance(obj, torch.Tensor):
        if _is_float(obj):
            out.append((label, obj))
    elif depth > 6:
        pass
    elif isinstance(obj, (tuple, list)):
        for i, x in enumerate(obj):
            flatten(x, f"{label}[{i}]", out, depth + 1)
    elif isinstance(obj, dict) or (hasattr(obj, "keys") and hasattr(obj, "items")):
        for k, x in obj.items():
            flatten(x, f"{label}['{k}']", out, depth + 1)
    return out


# ---------------------------------------------------------------------------------------------
# one checked forward + backward


@dataclass
class CallRecord:
    index: int                 # pre-hook (execution) order
    name: str
    type: str
    depth: int
    module: Any = None
    inputs: list = field(default_factory=list)    # [(label, tensor, version)]
    inputs_finite: bool = True
    in_keys: list = field(default_factory=list)
    out_keys: list = field(default_factory=list)
    done: int = -1             # completion order
    bad_outputs: list = field(default_factory=list)   # [(label, nan, inf)]
    input_range: tuple = (None, None)
    input_note: str = ""


class Checker(ForwardHooks):
    """Forward hooks on every module: finiteness of inputs and outputs; tensor hooks on every
    module input/output that needs a gradient: finiteness of the gradients in backward order."""

    def __init__(self, model):
        import torch

        global _Tensor
        _Tensor = torch.Tensor
        _init_dtypes()
        super().__init__(model)
        self.calls: list[CallRecord] = []
        self._stack: list[CallRecord] = []
        self._tensor_handles: list = []
        self._seen: dict[int, tuple] = {}        # id -> (weakref, version, finite)
        self._grad_keys: dict[tuple, int] = {}   # (id, version) -> slot
        self.grad_events: list = []              # slot -> (order, finite, nan, inf) once fired
        self._order = 0
        self.completed = 0

    pre_kwargs = True

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
        slot = self._grad_keys.get(key)
        if slot is None:
            slot = len(self.grad_events)
            self.grad_events.append(None)
            self._grad_keys[key] = slot
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
        rec = CallRecord(len(self.calls), name, type(mod).__name__, name.count(".") + 1 if name else 0, mod)
        if not kwargs and all(type(a) is _Tensor for a in args):   # the common case, fast
            ins = [(f"input[{i}]", a) for i, a in enumerate(args) if a.is_floating_point() or a.is_complex()]
        else:
            ins = flatten(tuple(args), "input", []) + flatten(dict(kwargs), "input", [])
        ok = True
        for label, t in ins:
            if not self.known_finite(t):
                ok = False
            rec.inputs.append((label, t, t._version))
            if self._track_grads:
                slot = self._grad_slot(t)
                if slot is not None:
                    rec.in_keys.append(slot)
        rec.inputs_finite = ok
        self.calls.append(rec)
        self._stack.append(rec)

    def _post(self, mod, args, output):
        if not self._stack:
            return
        rec = self._stack.pop()
        rec.done = self.completed
        self.completed += 1
        if type(output) is _Tensor:
            outs = [("output", output)] if output.is_floating_point() or output.is_complex() else []
        else:
            outs = flatten(output, "output", [])
        for label, t in outs:
            if not self.known_finite(t):
                nan, inf = counts(t)
                rec.bad_outputs.append((label, nan, inf))
            if self._track_grads:
                slot = self._grad_slot(t)
                if slot is not None:
                    rec.out_keys.append(slot)
        if rec.bad_outputs and rec.inputs_finite and self.origin is None:
            self.origin = rec
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
        # inputs are only needed until the call ends
        rec.inputs = [(label, None, v) for label, _, v in rec.inputs] if rec is not self.origin else rec.inputs

    _track_grads = True
    origin: CallRecord | None = None

    @property
    def failing(self) -> Call | None:
        """For tracking.forward_error: the innermost module still open after an exception."""
        if not self._stack:
            return None
        rec = self._stack[-1]
        from ..core.tracking import describe

        shapes = describe(tuple(t for _, t, _ in rec.inputs if t is not None))
        return Call(rec.name, rec.type, rec.depth, inputs=shapes)

    def release(self):
        """Drop references to tensors (keep the origin's input range only)."""
        self._seen.clear()
        for rec in self.calls:
            rec.inputs = []
            rec.module = None


@dataclass
class PassReport:
    calls: list
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


def localized_pass(model, inputs, loss_fn, reset=None) -> PassReport:
    """The cheap pass first (forward hooks, parameter gradients checked after backward); only when
    a gradient is non-finite with a finite forward and loss, the same pass again (same RNG state,
    buffers reset by `reset`) with gradient hooks on every module to name the backward culprit."""
    import torch

    rng = torch.random.get_rng_state()
    rep = checked_pass(model, inputs, loss_fn, track_grads=False)
    if rep.backward_ran and rep.param_grad_rows and rep.origin is None and not rep.output_bad and rep.loss_finite:
        for p in model.parameters():
            p.grad = None
        if reset is not None:
            reset()
        torch.random.set_rng_state(rng)
        rep = checked_pass(model, inputs, loss_fn, track_grads=True)
        rep.localized = True
    return rep


def checked_pass(model, inputs, loss_fn, *, backward: bool = True, track_grads: bool = True) -> PassReport:
    """One forward (+ loss + backward) with every module hooked; fills .grad of `model`.
    track_grads: also hook every module input/output gradient (backward culprit)."""
    import torch

    checker = Checker(model)
    checker._track_grads = backward and track_grads and torch.is_grad_enabled()
    try:
        with checker:
            try:
                output = inputs.call(model)
            except ModelError:
                raise
            except Exception as exc:
                raise forward_error(exc, checker) from exc
        root = next((c for c in checker.calls if c.name == ""), None)
        output_bad = [(label, *counts(t)) for label, t in flatten(output, "output", []) if not finite(t)]

        loss_value, loss_desc, loss_finite = None, "", True
        loss = None
        if loss_fn is not None:
            loss = loss_fn(output)
            loss_desc = loss_fn.describe()
        else:
            from ..core.loss import primary_output

            y, picked = primary_output(output)
            loss, loss_desc = y.float().sum(), f"sum on {picked}"
        loss_value = float(loss.detach())
        loss_finite = math.isfinite(loss_value)

        backward_ran = False
        note = ""
        if backward and torch.is_grad_enabled() and loss.requires_grad:
            try:
                loss.backward()
            except Exception as exc:
                raise ModelError(f"backward failed: {one_line(exc)}",
                                 hint="the model's own code raised in backward; run with --anomaly or --debug") from exc
            backward_ran = True
        elif backward:
            note = "the loss does not require grad (no trainable parameter reached it): backward skipped"
    finally:
        checker.remove_tensor_hooks()

    events = checker.grad_events
    out_grad_bad = False
    if root is not None and backward_ran:
        fired = [events[s] for s in root.out_keys if events[s] is not None]
        out_grad_bad = any(not e[1] for e in fired)

    # backward culprit: non-finite gradient w.r.t. inputs while the gradient at outputs was finite
    backward_rows, candidates = [], []
    param_rows = []
    grads = [(name, p) for name, p in model.named_parameters() if p.grad is not None]
    checked = len(grads)
    for name, p in ([] if all_finite(p.grad for _, p in grads) else grads):  # one sync when healthy
        if not finite(p.grad):
            nan, inf = counts(p.grad)
            param_rows.append({"parameter": name, "shape": "x".join(map(str, p.shape)) or "scalar",
                               "nan": nan, "inf": inf})
    bad_params_by_module: dict[str, list] = {}
    for r in param_rows:
        mod_name = r["parameter"].rsplit(".", 1)[0] if "." in r["parameter"] else ""
        bad_params_by_module.setdefault(mod_name, []).append(r)

    if backward_ran:
        for rec in checker.calls:
            outs = [events[s] for s in rec.out_keys if events[s] is not None]
            if not outs:
                continue
            ins = [events[s] for s in rec.in_keys if events[s] is not None]
            bad_in = [e for e in ins if not e[1]]
            out_ok = all(e[1] for e in outs)
            if bad_in:
                nan, inf = sum(e[2] for e in bad_in), sum(e[3] for e in bad_in)
                order = min(e[0] for e in bad_in)
                backward_rows.append({"module": rec.name or "(root)", "type": rec.type, "order": order,
                                      "grad_out_finite": out_ok, "nan": nan, "inf": inf, "via": "inputs",
                                      "_depth": rec.depth})
                if out_ok:
                    candidates.append((order, -rec.depth, rec.name, rec.type, "inputs", nan, inf))
            elif out_ok and rec.name in bad_params_by_module and not rec.in_keys:
                # inputs need no gradient (first layer): its own parameters tell
                rows = bad_params_by_module[rec.name]
                order = max(e[0] for e in outs) + 0.5
                nan, inf = sum(r["nan"] for r in rows), sum(r["inf"] for r in rows)
                backward_rows.append({"module": rec.name or "(root)", "type": rec.type, "order": order,
                                      "grad_out_finite": True, "nan": nan, "inf": inf,
                                      "via": "parameters", "_depth": rec.depth})
                candidates.append((order, -rec.depth, rec.name, rec.type, "parameters", nan, inf))
        backward_rows.sort(key=lambda r: (r["order"], -r["_depth"]))
    backward_origin = None
    if candidates:
        order, _, name, kind, via, nan, inf = min(candidates)
        backward_origin = {"name": name, "type": kind, "via": via, "nan": nan, "inf": inf}
    checker.release()
    return PassReport(checker.calls, checker.origin, output_bad, loss_value, loss_desc, loss_finite,
                      out_grad_bad, backward_origin, backward_rows, param_rows, checked, backward_ran, note)


# ---------------------------------------------------------------------------------------------
# the diagnostic


def _nonfinite_state(model) -> list[dict]:
    rows = []
    state = [(kind, name, t) for kind, items in (("parameter", model.named_parameters()),
                                                  ("buffer", model.named_buffers())) for name, t in items]
    if any(t.device.type == "meta" for _, _, t in state):
        raise UsageError("nancheck needs real values; --device meta has none", hint="use --device cpu or cuda")
    floats = [(kind, name, t) for kind, name, t in state if _is_float(t)]
    for kind, name, t in ([] if all_finite(t for _, _, t in floats) else floats):  # one sync when healthy
        if not finite(t):
            nan, inf = counts(t)
            rows.append({"tensor": name, "kind": kind, "shape": "x".join(map(str, t.shape)) or "scalar",
                         "nan": nan, "inf": inf})
    return rows


def _own_code(origin, done) -> dict | None:
    """When the origin called submodules, where in its own code the values went bad: after which
    nested call (the last to finish before) and before which (the first to receive a non-finite
    input). None when the origin called no submodule (the culprit is already as narrow as it gets).
    A call c is nested in the origin when it started after it (index) and finished before it (done)."""
    nested = [c for c in done if c.index > origin.index and c.done < origin.done]
    if not nested:
        return None
    consumers = [c for c in nested if not c.inputs_finite]
    consumer = min(consumers, key=lambda c: c.index) if consumers else None
    # calls that finished before the consumer started (not its ancestors, which were still open)
    before = [c for c in nested if consumer is None or (c.index < consumer.index and c.done < consumer.done)]
    after = max(before, key=lambda c: c.done) if before else None
    return {"after": (after.name or "(root)") if after else None, "after_type": after.type if after else None,
            "first_consumer": (consumer.name or "(root)") if consumer else None,
            "first_consumer_type": consumer.type if consumer else None}


def _fmt_counts(nan: int, inf: int) -> str:
    parts = []
    if nan:
        parts.append(f"{nan:,} NaN")
    if inf:
        parts.append(f"{inf:,} Inf")
    return " and ".join(parts) or "non-finite values"


def _fmt_range(lo, hi) -> str:
    if lo is None:
        return "no finite floating inputs"
    return f"[{lo:.4g}, {hi:.4g}]"


def run(model, inputs, opts: Options | None = None) -> Result:
    import torch

    opts = opts or Options()
    if opts.steps < 0:
        raise UsageError("--steps must be ≥ 0")
    if opts.optimizer.lower() not in OPTIMIZERS:
        raise UsageError(f"unknown optimizer '{opts.optimizer}'", hint="choose " + "|".join(OPTIMIZERS))
    if opts.steps and not (opts.lr > 0):
        raise UsageError(f"--lr must be > 0 (got {opts.lr})")
    result = Result("nancheck", header={"mode": "train mode, one forward+backward (buffers restored)"})
    if opts.anomaly:
        result.header["anomaly_mode"] = "also run under torch.autograd.detect_anomaly(check_nan=True)"
    if opts.steps:
        result.header["training"] = f"{opts.steps} × {opts.optimizer.lower()} (lr={opts.lr:g}) on a copy, same batch"

    # 1. inputs
    input_rows = []
    for name, t in inputs.tensors():
        if t.device.type == "meta":
            raise UsageError("nancheck needs real values; --device meta has none", hint="use --device cpu or cuda")
        if _is_float(t) and not finite(t):
            nan, inf = counts(t)
            input_rows.append({"tensor": name, "kind": "input", "shape": "x".join(map(str, t.shape)) or "scalar",
                               "nan": nan, "inf": inf})
            result.add("non-finite-input", "error", name, f"model input {name} holds {_fmt_counts(nan, inf)}",
                       hint="the data is bad before the model runs: check the data pipeline")
    # 2. parameters and buffers
    state_rows = _nonfinite_state(model)
    for r in state_rows:
        result.add("non-finite-param", "error", r["tensor"],
                   f"{r['kind']} {r['tensor']} ({r['shape']}) already holds {_fmt_counts(r['nan'], r['inf'])}",
                   hint="check the initialisation or the checkpoint that was loaded")
    # JSON keys are stable: every table is present (empty lists on a clean run; the console and
    # TensorBoard skip empty tables), and optional parts are null when not requested
    result.tables.append(Table("non_finite_tensors", "Non-finite inputs, parameters and buffers", [
        Column("tensor", "tensor"), Column("kind", "kind"), Column("shape", "shape"),
        Column("nan", "NaN", "count"), Column("inf", "Inf", "count")], input_rows + state_rows))

    # 3-6. forward, loss, backward, parameter gradients
    rng = torch.random.get_rng_state()
    with leave_no_trace(model):
        saved = snapshot_buffers(model)
        try:
            for p in model.parameters():
                p.grad = None
            model.train()
            torch.set_grad_enabled(True)
            report = localized_pass(model, inputs, opts.loss, reset=lambda: restore_buffers(saved))
            anomaly = None
            if opts.anomaly:
                for p in model.parameters():
                    p.grad = None
                restore_buffers(saved)
                torch.random.set_rng_state(rng)
                anomaly = _anomaly_pass(model, inputs, opts.loss)
        finally:
            restore_buffers(saved)
    if report.loss_desc:
        result.header["loss"] = report.loss_desc
    _report_pass(result, report, model)
    if anomaly is not None:
        _report_anomaly(result, anomaly)
    else:
        result.data["anomaly"] = None

    # --steps on a copy
    if opts.steps:
        if any(f.severity == "error" for f in result.findings):
            result.notes.append("--steps skipped: values are already non-finite before any optimizer step")
            result.data["steps"] = {"requested": opts.steps, "ran": 0, "first_non_finite_step": None}
            result.series["loss_per_step"] = []
        else:
            _run_steps(result, model, inputs, opts)
    else:
        result.data["steps"] = None
        result.data["loss_per_step"] = None

    failed = [f for f in result.findings if f.severity == "error"]
    if failed:
        f = failed[0]
        result.verdict = f"FAIL: {f.code} at {f.where or '(model)'}"
    else:
        result.verdict = "PASS: no NaN or Inf in inputs, parameters, forward outputs, loss or gradients"
        if opts.steps:
            result.verdict += f" (and none in {opts.steps} optimizer steps)"
    return result


def _report_pass(result: Result, rep: PassReport, model) -> None:
    calls = rep.calls
    done = sorted((c for c in calls if c.done >= 0), key=lambda c: c.done)
    bad = [c for c in done if c.bad_outputs]
    origin = rep.origin
    result.data["modules_checked"] = len(calls)
    result.data["loss_value"] = rep.loss_value
    forward = None
    if origin is not None:
        label, nan, inf = origin.bad_outputs[0]
        tot_nan = sum(b[1] for b in origin.bad_outputs)
        tot_inf = sum(b[2] for b in origin.bad_outputs)
        lo, hi = origin.input_range
        where = origin.name or "(root)"
        own = _own_code(origin, done)
        forward = {"module": where, "type": origin.type, "output": label, "nan": tot_nan, "inf": tot_inf,
                   "outputs": [{"output": lb, "nan": n, "inf": i} for lb, n, i in origin.bad_outputs],
                   "input_min": lo, "input_max": hi, "later_modules_affected": len(bad) - 1, "own_code": own}
        msg = (f"{where} ({origin.type}) produced {_fmt_counts(tot_nan, tot_inf)} in {label} from finite inputs "
               f"(input range {_fmt_range(lo, hi)})")
        if origin.input_note:
            msg += f"; {origin.input_note}"
        if own and own["first_consumer"]:
            consumer = f"{own['first_consumer']} ({own['first_consumer_type']})"
            msg += (f"; it arose in {where}'s own forward code, not in a submodule: "
                    + (f"between {own['after']} ({own['after_type']}) returning finite values and {consumer} "
                       "receiving it" if own["after"] else f"before its first submodule call, {consumer}, received it"))
        elif own:
            msg += (f"; every submodule it called returned finite values: it arose in {where}'s own forward code "
                    f"after its last submodule call, {own['after']} ({own['after_type']})")
        if len(bad) > 1:
            msg += f"; {len(bad) - 1} other module call(s) downstream carry it on"
        result.add("non-finite-output", "error", where, msg,
                   hint="look at the operations in this module's forward (log/sqrt/division/exp/pow) for these inputs")
    elif bad:
        # non-finite from the start (inputs or parameters): name the first module anyway
        first = bad[0]
        result.notes.append(f"forward: the first non-finite output is at {first.name or '(root)'} ({first.type}), "
                            "but its inputs were already non-finite")
    result.data["forward"] = forward
    rows = []
    for c in bad[:MAX_ROWS]:
        label, nan, inf = c.bad_outputs[0]
        rows.append({"order": c.done, "module": c.name or "(root)", "type": c.type, "output": label,
                     "nan": sum(b[1] for b in c.bad_outputs), "inf": sum(b[2] for b in c.bad_outputs),
                     "inputs_finite": c.inputs_finite, "origin": c is origin,
                     "_style": "bold red" if c is origin else "dim"})
    note = None
    if rows:
        note = f"{len(bad)} module call(s) with non-finite outputs, in completion order (innermost first)"
        if len(bad) > MAX_ROWS:
            note += f"; first {MAX_ROWS} shown"
    result.tables.append(Table("forward_non_finite", "Forward: modules whose output is non-finite", [
        Column("order", "#", "int"), Column("module", "module"), Column("type", "type"),
        Column("output", "output"), Column("nan", "NaN", "count"), Column("inf", "Inf", "count"),
        Column("inputs_finite", "inputs finite", "int"), Column("origin", "origin", "int")], rows, note=note))

    # loss
    forward_bad = bool(rep.output_bad)
    if not rep.loss_finite:
        why = ("because the model output is already non-finite" if forward_bad else
               "from a finite model output: the loss function itself produced it")
        result.add("non-finite-loss", "error", "loss", f"loss ({rep.loss_desc}) = {rep.loss_value} {why}",
                   hint=None if forward_bad else "check the loss for log(0), division by zero or overflow; "
                                                  "a custom --loss PATH:fn is called as fn(output, target)")
    # backward
    result.data["backward"] = rep.backward_origin
    upstream = forward_bad or not rep.loss_finite or bool(result.findings)
    backward_rows = []
    if rep.backward_ran:
        if rep.backward_origin and not upstream:
            b = rep.backward_origin
            where = b["name"] or "(root)"
            via = ("its inputs" if b["via"] == "inputs" else "its own parameters (its inputs need no gradient)")
            result.add("non-finite-grad", "error", where,
                       f"{where} ({b['type']}) turned a finite output gradient into {_fmt_counts(b['nan'], b['inf'])} "
                       f"in the gradient w.r.t. {via}; the forward pass was finite",
                       hint="a backward-only NaN: sqrt/norm/pow at 0, acos/asin at ±1, log of 0 masked by where(), "
                            "or 0×inf; add an eps or clamp")
        elif rep.output_grad_bad and not upstream:
            result.add("non-finite-grad", "error", "loss",
                       "the gradient of the loss w.r.t. the model output is non-finite while the loss is finite",
                       hint="the loss function's backward produced it")
        if rep.backward_rows:
            shown = rep.backward_rows[:MAX_ROWS]
            for r in shown:
                r["origin"] = bool(rep.backward_origin) and r["module"] == (rep.backward_origin["name"] or "(root)")
                r["_style"] = "bold red" if r["origin"] else "dim"
            backward_rows = shown
    elif rep.backward_note:
        result.notes.append(rep.backward_note)
    result.tables.append(Table("backward_non_finite", "Backward: modules whose input gradient is non-finite", show=not upstream, columns=[
        Column("order", "#", "float"), Column("module", "module"), Column("type", "type"),
        Column("via", "w.r.t."), Column("grad_out_finite", "grad at output finite", "int"),
        Column("nan", "NaN", "count"), Column("inf", "Inf", "count")], rows=backward_rows,
        note="in backward order; the origin is the first whose output gradient was finite"))
    # parameter gradients
    result.data["param_grads_checked"] = rep.grads_checked
    rows = rep.param_grad_rows
    if rows:
        first = rows[0]
        others = ", ".join(r["parameter"] for r in rows[1:6]) + (" …" if len(rows) > 6 else "")
        cause = (" (follows from the non-finite forward/loss)" if upstream else
                 f" (from the backward of {rep.backward_origin['name'] or '(root)'})" if rep.backward_origin else "")
        result.add("non-finite-param-grad", "error", first["parameter"],
                   f"{len(rows)} of {rep.grads_checked} parameter gradient(s) are non-finite{cause}; first "
                   f"{first['parameter']} ({_fmt_counts(first['nan'], first['inf'])})" + (f"; also {others}" if others else ""))
    result.tables.append(Table("param_grads_non_finite", "Parameter gradients with NaN/Inf", [
        Column("parameter", "parameter"), Column("shape", "shape"), Column("nan", "NaN", "count"),
        Column("inf", "Inf", "count")], list(rows[:MAX_ROWS])))

    ok = "finite"
    result.summary += [
        ("Inputs", ok if not any(f.code == "non-finite-input" for f in result.findings) else "NON-FINITE"),
        ("Parameters and buffers", ok if not any(f.code == "non-finite-param" for f in result.findings) else "NON-FINITE"),
        ("Forward", f"{len(calls)} module calls checked; " +
         ("all outputs finite" if not bad else
          f"first non-finite at {origin.name or '(root)'} ({origin.type})" if origin is not None else
          f"first non-finite at {bad[0].name or '(root)'} ({bad[0].type})")),
        ("Loss", f"{rep.loss_value:.6g} ({rep.loss_desc})" if rep.loss_value is not None else "—"),
        ("Backward", "not run" if not rep.backward_ran else
         "non-finite (follows from the forward/loss)" if upstream and rep.param_grad_rows else
         f"first non-finite at {rep.backward_origin['name'] or '(root)'}" if rep.backward_origin else
         "non-finite" if rep.param_grad_rows or rep.output_grad_bad else "all gradients finite"),
        ("Parameter gradients", f"{rep.grads_checked} checked; " +
         (f"{len(rep.param_grad_rows)} non-finite" if rep.param_grad_rows else "all finite")),
    ]


# ---------------------------------------------------------------------------------------------
# --anomaly


def _anomaly_pass(model, inputs, loss_fn) -> dict:
    import warnings

    import torch

    out = {"raised": False, "op": None, "message": None, "forward_trace": []}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.autograd.detect_anomaly(check_nan=True):
            try:
                output = inputs.call(model)
                loss = loss_fn(output) if loss_fn is not None else output.float().sum()
                if loss.requires_grad:
                    loss.backward()
            except RuntimeError as exc:
                out["raised"] = True
                out["message"] = one_line(exc)
            except Exception as exc:  # the model's own error: the main pass already ran it
                out["raised"] = True
                out["message"] = one_line(exc)
    for w in caught:
        text = str(w.message)
        if "Traceback of forward call" in text:
            head, _, trace = text.partition("Traceback of forward call that caused the error:")
            out["op"] = head.replace("Error detected in", "").strip().rstrip(".")
            lines = [ln for ln in trace.splitlines() if ln.strip() and "Triggered internally" not in ln]
            out["forward_trace"] = lines
    return out


def _report_anomaly(result: Result, a: dict) -> None:
    frames = parse_frames(a["forward_trace"])
    user = [f for f in frames if f["user"]]
    a = dict(a, user_frames=user)
    result.data["anomaly"] = a
    if not a["raised"]:
        result.notes.append("anomaly mode: no backward function returned NaN")
        return
    result.text["nancheck/anomaly"] = "```\n" + "\n".join(a["forward_trace"]) + "\n```"
    result.notes.append(f"anomaly mode stopped at {a['op'] or 'a backward function'}: {a['message']}")
    forward = result.data.get("forward")
    if forward or any(f.code in ("non-finite-input", "non-finite-param", "non-finite-loss") for f in result.findings):
        what = f"the forward NaN/Inf from {forward['module']}" if forward else "the non-finite values found above"
        result.notes.append(f"anomaly mode checks backward functions only: {a['op'] or 'the op it names'} is where "
                            f"{what} entered the backward, not where it was made")
    rows = [{"frame": f"{f['file']}:{f['line']} in {f['function']}", "code": f["code"]} for f in (user or frames[-3:])]
    note = "frames outside torch and torchdiag; the full trace is in JSON anomaly.forward_trace"
    if not user:
        in_loss = any(f["file"].replace("\\", "/").endswith("/torchdiag/core/loss.py") for f in frames)
        note = ("no frame in your code: the op was created " + ("by the loss (--loss)" if in_loss else "inside torch")
                + "; last frames shown; the full trace is in JSON anomaly.forward_trace")
    result.tables.append(Table("anomaly_frames", f"Anomaly mode: forward call that created {a['op'] or 'the failing op'}",
                               [Column("frame", "where (outermost first)"), Column("code", "code")], rows, note=note))


_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<fn>.+)$')


def parse_frames(lines: list[str]) -> list[dict]:
    """Frames of a Python traceback text: file, line, function, code, and whether it is user code."""
    frames = []
    for i, ln in enumerate(lines):
        m = _FRAME.match(ln)
        if not m:
            continue
        code = lines[i + 1].strip() if i + 1 < len(lines) and not _FRAME.match(lines[i + 1]) else ""
        path = m.group("file")
        norm = path.replace("\\", "/")
        internal = ("site-packages" in norm or "dist-packages" in norm or norm.startswith("<")
                    or "/torchdiag/" in norm or "/torch/" in norm or norm.endswith("/runpy.py")
                    or re.search(r"/(bin|Scripts)/torchdiag(\.exe|-script\.py)?$", norm) is not None)
        frames.append({"file": path, "line": int(m.group("line")), "function": m.group("fn"), "code": code,
                       "user": not internal})
    # frames above torchdiag's first frame are whoever called torchdiag (console script, a test, an
    # API user's script), not the code that created the op
    first = next((i for i, f in enumerate(frames) if "/torchdiag/" in f["file"].replace("\\", "/")), 0)
    for f in frames[:first]:
        f["user"] = False
    return frames


# ---------------------------------------------------------------------------------------------
# --steps


def _make_optimizer(params, name: str, lr: float):
    import torch

    name = name.lower()
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr)
    return torch.optim.AdamW(params, lr=lr)


def _norm(p) -> float:
    import torch

    return float(torch.linalg.vector_norm(p.detach(), dtype=torch.float64))


def _grew_most(work, start: dict) -> dict | None:
    """The trainable parameter whose norm grew most since step 1 (relative; absolute from zero):
    the weights to look at when the forward, loss or backward goes non-finite while every
    parameter is still finite."""
    best, key = None, None
    for n, p in work.named_parameters():
        if n not in start:
            continue
        now = _norm(p)
        k = (now / start[n], 0.0) if start[n] > 0 else (math.inf if now > 0 else 1.0, now)
        if key is None or k > key:
            best, key = {"parameter": n, "norm_start": start[n], "norm_now": now}, k
    if best is not None and best["norm_now"] <= best["norm_start"]:
        return None       # nothing grew: the weights are not the story
    return best


def _run_steps(result: Result, model, inputs, opts: Options) -> None:
    import torch

    rng = torch.random.get_rng_state()
    grad_mode = torch.is_grad_enabled()
    try:
        torch.manual_seed(opts.seed)
        work = copy.deepcopy(model)
        for p in work.parameters():
            p.grad = None
        work.train()
        torch.set_grad_enabled(True)
        params = [p for p in work.parameters() if p.requires_grad]
        if not params:
            result.notes.append("--steps skipped: the model has no trainable parameters")
            return
        opt = _make_optimizer(params, opts.optimizer, opts.lr)
        start = {n: _norm(p) for n, p in work.named_parameters() if p.requires_grad}
        losses: list = []
        first = None
        ran = 0
        for step in range(1, opts.steps + 1):
            opt.zero_grad(set_to_none=True)
            try:
                rep = localized_pass(work, inputs, opts.loss)
            except ModelError as exc:
                raise ModelError(f"step {step}: {exc.message}", exc.hint) from exc
            ran = step
            losses.append(rep.loss_value)
            if rep.origin is not None:
                o = rep.origin
                first = {"step": step, "phase": "forward", "where": o.name or "(root)", "type": o.type,
                         "nan": sum(b[1] for b in o.bad_outputs), "inf": sum(b[2] for b in o.bad_outputs),
                         "input_min": o.input_range[0], "input_max": o.input_range[1]}
                break
            if not rep.loss_finite:
                first = {"step": step, "phase": "loss", "where": "loss", "value": rep.loss_value}
                break
            if rep.backward_origin or rep.output_grad_bad or rep.param_grad_rows:
                b = rep.backward_origin
                first = {"step": step, "phase": "backward",
                         "where": (b["name"] or "(root)") if b else "loss",
                         "type": b["type"] if b else None,
                         "parameters": [r["parameter"] for r in rep.param_grad_rows]}
                break
            try:
                opt.step()
            except Exception as exc:
                raise ModelError(f"optimizer step {step} raised {one_line(exc)}") from exc
            params = list(work.named_parameters())
            bad = [] if all_finite(p for _, p in params) else [(n, p) for n, p in params if not finite(p.detach())]
            if bad:
                name, p = bad[0]
                nan, inf = counts(p)
                first = {"step": step, "phase": "update", "where": name, "nan": nan, "inf": inf,
                         "parameters": [n for n, _ in bad]}
                break
        if first is not None and first["phase"] != "update":
            first["grew_most"] = _grew_most(work, start)
        del work, opt
    finally:
        torch.random.set_rng_state(rng)
        torch.set_grad_enabled(grad_mode)

    result.series["loss_per_step"] = losses
    result.data["steps"] = {"requested": opts.steps, "ran": ran, "optimizer": opts.optimizer.lower(), "lr": opts.lr,
                            "first_non_finite_step": first["step"] if first else None, "first": first}
    from ..render.fmt import sparkline

    shown = [v for v in losses if v is not None and math.isfinite(v)]
    spark = sparkline([math.log10(v) for v in shown]) if shown and min(shown) > 0 else sparkline(shown)
    result.summary.append(("Steps", f"{ran} of {opts.steps} run; loss {spark} "
                           + (f"{shown[0]:.4g} → {shown[-1]:.4g}" if shown else "")))
    if not first:
        return
    step, phase = first["step"], first["phase"]
    cfg = f"{opts.optimizer.lower()}, lr={opts.lr:g}, same batch"
    after = (f"by the update of step {step} ({cfg})" if phase == "update" else
             f"in step {step}, after {step - 1} update(s) ({cfg})")
    hint = "lower the learning rate, clip gradients, or look for an op that overflows as weights grow"
    grew = first.get("grew_most")
    grown = (f"; the weights grew most in {grew['parameter']} (norm {grew['norm_start']:.4g} → {grew['norm_now']:.4g})"
             if grew else "")
    if phase == "update":
        more = len(first["parameters"]) - 1
        result.add("non-finite-param", "error", first["where"],
                   f"parameter {first['where']} became non-finite ({_fmt_counts(first['nan'], first['inf'])}) "
                   f"{after}" + (f"; {more} other parameter(s) too" if more else ""), hint=hint)
    elif phase == "forward":
        result.add("non-finite-output", "error", first["where"],
                   f"{first['where']} ({first['type']}) produced {_fmt_counts(first['nan'], first['inf'])} from finite "
                   f"inputs (range {_fmt_range(first['input_min'], first['input_max'])}) in the forward {after}; "
                   f"all parameters were still finite{grown}", hint=hint)
    elif phase == "loss":
        result.add("non-finite-loss", "error", "loss",
                   f"the loss became {first['value']} {after} while the model output and all parameters were "
                   f"finite{grown}", hint=hint)
    else:
        params = first["parameters"]
        if first["where"] != "loss" and first["type"]:
            result.add("non-finite-grad", "error", first["where"],
                       f"{first['where']} ({first['type']}) produced a non-finite gradient in the backward {after}{grown}",
                       hint=hint)
        if params:
            result.add("non-finite-param-grad", "error", params[0],
                       f"{len(params)} parameter gradient(s) non-finite in the backward {after}; first {params[0]}"
                       + ("" if first["where"] != "loss" and first["type"] else grown), hint=hint)
