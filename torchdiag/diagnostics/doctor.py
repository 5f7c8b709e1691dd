"""doctor: the silent-killer checklist — bugs that let a model train while doing the wrong thing.

Independent checks, each ending in a row of the checklist (check, result, verdict, where, hint) and,
when something is wrong, a finding with a stable code naming the module or parameter:

  device       device-mismatch    the model is rebuilt with its weights on `meta` and run WITHOUT a
                                  default-device context: a tensor made in forward without a device
                                  (torch.arange(n), torch.zeros(...)) lands on the CPU, and an op
                                  mixing it with meta tensors is caught (a dispatch mode also checks
                                  ops meta itself would let through, such as matmul). Parameters and
                                  buffers spread over several devices are reported too.
  in-place     inplace-autograd   backward fails because a tensor saved for backward was edited in
                                  place: a second forward with saved-tensor hooks watches the version
                                  counters and names the module whose forward did the edit.
  modes        mode-dependent     Dropout/BatchNorm-family modules make train and eval outputs differ
               batchnorm-batch-1  BatchNorm in train mode with a batch of 1 raises
               nondeterministic-eval  two eval forwards on the same input differ; the module that
                                  first turns equal inputs into different outputs is named
  parameters   param-not-updated  a parameter has .grad but one optimizer step (Adam) leaves it
                                  unchanged, or the next forward writes it back
               frozen             requires_grad=False parameters, listed by module (info)
  dtypes       dtype-mismatch     parameters of mixed floating dtypes; float inputs of another dtype
  inputs       non-finite-input, unnormalised-input (image-like float input in [0, 255]),
               target-out-of-range (class targets from --batch vs the output width)

Everything that runs the model works on a deep copy; the user's model is only read.
"""
from __future__ import annotations

import contextlib
import copy
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ..core.guard import leave_no_trace
from ..core.tracking import ForwardHooks, ModuleTracker, describe, forward_error, run_forward
from ..errors import ModelError, one_line
from ..results import Column, Result, Table

MODE_TYPES_HINT = "call model.eval() before validation/inference and model.train() before training steps"


@dataclass
class Options:
    loss: Any = None              # core.loss.Loss (t.loss()); default: the auto rule
    factory: Any = None           # the model factory, for the meta rebuild of the device check
    kwargs: dict = field(default_factory=dict)
    batch_target: Any = None      # the target from --batch, if any
    lr: float = 1e-3              # Adam learning rate of the one-step update check
    seed: int = 0


# ---------------------------------------------------------------------------------------------
# The checklist
# ---------------------------------------------------------------------------------------------

CHECK_TITLES = {
    "device": "devices",
    "inplace": "in-place/autograd",
    "modes": "train/eval modes",
    "batchnorm": "BatchNorm batch 1",
    "determinism": "eval determinism",
    "update": "params update",
    "frozen": "frozen params",
    "dtype": "dtypes",
    "inputs": "inputs",
    "target": "class targets",
}
_STYLE = {"error": "bold red", "warning": "yellow", "skipped": "dim"}


class Checklist:
    def __init__(self, result: Result):
        self.result = result
        self.rows: dict[str, dict] = {}

    def row(self, check: str, status: str, verdict: str, where: str = "", hint: str = "", code: str = "") -> None:
        """One line per check; a later call for the same check replaces a less severe verdict."""
        order = {"ok": 0, "skipped": 0, "info": 1, "warning": 2, "error": 3}
        old = self.rows.get(check)
        if old is not None and order[old["status"]] > order[status]:
            return
        if old is not None and old["status"] == status and old["code"] == code and code and where:
            wheres = old["_wheres"] + [where]   # several culprits of one kind: list them
            shown = ", ".join(wheres[:3]) + (f" (+{len(wheres) - 3} more)" if len(wheres) > 3 else "")
            old.update(where=shown, _wheres=wheres, verdict=verdict)
            return
        self.rows[check] = {"check": CHECK_TITLES[check], "id": check, "status": status, "code": code,
                            "verdict": verdict, "where": where, "hint": hint, "_wheres": [where] if where else [],
                            "_hint": _short(hint), "_style": _STYLE.get(status)}

    def find(self, check: str, code: str, severity: str, where: str, message: str, hint: str,
             verdict: str | None = None) -> None:
        self.result.add(code, severity, where, message, hint)
        self.row(check, severity, verdict or message, where or "(model)", hint, code)

    def has_error(self, *checks: str) -> bool:
        return any(self.rows.get(c, {}).get("status") == "error" for c in checks)

    def table(self) -> Table:
        rows = [self.rows.get(k) or {"check": t, "id": k, "status": "skipped", "code": "", "verdict": "not run",
                                     "where": "", "hint": "", "_style": "dim"}
                for k, t in CHECK_TITLES.items()]
        return Table("checks", "Checklist", [
            Column("check", "check"), Column("status", "result"), Column("verdict", "verdict"),
            Column("where", "where"), Column("_hint", "hint")], rows,
            note="full hints with each finding below; --json has every row")


def _short(hint: str) -> str:
    """The first clause of a hint, for the table (findings and JSON keep the whole hint)."""
    for sep in ("; ", " ("):
        if sep in hint:
            hint = hint.split(sep, 1)[0]
    return hint


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------

def _name(n: str) -> str:
    return n or "(root)"


def _tensors(obj, prefix="output") -> list:
    from ..core.inputs import _collect

    out: list = []
    _collect(prefix, obj, out)
    return out


def _module_of(param_name: str) -> str:
    return param_name.rpartition(".")[0]


@contextlib.contextmanager
def workspace(model):
    """A deep copy to run (and train) on; if the model cannot be copied, the model itself with
    its parameters and buffers restored bit for bit afterwards."""
    import torch

    try:
        work = copy.deepcopy(model)
    except Exception:
        work = None
    if work is not None:
        _copy_tensor_hooks(model, work)
        for p in work.parameters():
            p.grad = None
        yield work
        return
    saved = {k: v.detach().clone() for k, v in model.state_dict(keep_vars=True).items()}
    try:
        yield model
    finally:
        with torch.no_grad():
            for k, v in model.state_dict(keep_vars=True).items():
                if k in saved:
                    v.copy_(saved[k])


def _copy_tensor_hooks(model, work) -> None:
    """deepcopy drops hooks registered on parameters (p.register_hook): put them on the copy, so
    a hook that masks or zeroes a gradient acts there as it does in the user's model."""
    originals = dict(model.named_parameters())
    for name, q in work.named_parameters():
        p = originals.get(name)
        if p is None:
            continue
        for hook in list((getattr(p, "_backward_hooks", None) or {}).values()):
            q.register_hook(hook)
        for hook in list((getattr(p, "_post_accumulate_grad_hooks", None) or {}).values()):
            q.register_post_accumulate_grad_hook(hook)


def _batch_one(inputs, batch: int):
    return inputs.map(lambda t: t[:1] if t.dim() and t.shape[0] == batch else t)


def _is_bn_batch_error(exc) -> bool:
    return "Expected more than 1 value per channel when training" in str(exc)


def _is_inplace_error(exc) -> bool:
    s = str(exc)
    return ("modified by an inplace operation" in s or "leaf Variable that requires grad is being used in an in-place" in s
            or "a view of a leaf Variable that requires grad is being used in an in-place" in s)


def _is_dtype_error(exc) -> bool:
    s = str(exc).lower()
    return "dtype" in s or "scalar type" in s or "expected scalar" in s


def _is_device_error(exc) -> bool:
    s = str(exc).lower()
    return "device" in s and ("meta" in s or "cpu" in s or "cuda" in s)


# ---------------------------------------------------------------------------------------------
# Static checks: device spread, dtypes, frozen parameters, inputs
# ---------------------------------------------------------------------------------------------

def check_device_spread(model, ck: Checklist) -> None:
    by_dev: dict[str, list[str]] = {}
    for kind, named in (("param", model.named_parameters()), ("buffer", model.named_buffers())):
        for n, t in named:
            by_dev.setdefault(str(t.device), []).append(n)
    if len(by_dev) <= 1:
        return
    main = max(by_dev, key=lambda d: len(by_dev[d]))
    spread = ", ".join(f"{d}: {len(v)}" for d, v in by_dev.items())
    for dev, names in by_dev.items():
        if dev == main:
            continue
        modules = sorted({_module_of(n) for n in names})
        for m in modules:
            own = [n.rpartition(".")[2] for n in names if _module_of(n) == m]
            ck.find("device", "device-mismatch", "error", _name(m),
                    f"{', '.join(own)} on {dev} while most of the model is on {main} (tensors per device: {spread})",
                    f"move the whole model at once with model.to(device); register tensors as buffers so .to() moves them",
                    verdict=f"parameters/buffers on several devices ({spread})")


def check_dtypes(model, inputs, ck: Checklist) -> str | None:
    """Mixed floating parameter dtypes and float inputs of another dtype; returns the main dtype."""
    counts: Counter = Counter()
    params = list(model.named_parameters())
    for _, p in params:
        if p.is_floating_point():
            counts[p.dtype] += p.numel()
    if not counts:
        return None
    main = counts.most_common(1)[0][0]
    short = lambda d: str(d).replace("torch.", "")  # noqa: E731
    if len(counts) > 1:
        mix = ", ".join(f"{short(d)}: {n:,}" for d, n in counts.most_common())
        for n, p in params:
            if p.is_floating_point() and p.dtype != main:
                ck.find("dtype", "dtype-mismatch", "warning", n,
                        f"parameter is {short(p.dtype)} while the model is {short(main)} (params per dtype: {mix})",
                        f"create it as {short(main)} (torch.from_numpy gives float64; use .float()) or cast the "
                        f"whole model once with model.to({short(main)})",
                        verdict=f"mixed parameter dtypes ({mix})")
    for name, t in inputs.tensors():
        if t.is_floating_point() and t.dtype != main:
            ck.find("dtype", "dtype-mismatch", "error", name,
                    f"input is {short(t.dtype)} but the parameters are {short(main)}",
                    f"cast the input with .to({short(main)}) in the data pipeline (or the model to {short(t.dtype)})",
                    verdict=f"{name} is {short(t.dtype)}, parameters are {short(main)}")
    if "dtype" not in ck.rows:
        ck.row("dtype", "ok", f"all {short(main)}")
    return short(main)


def frozen_groups(model) -> list[tuple[str, list[str], int, bool]]:
    """(module, frozen parameter names, count, whole subtree frozen), topmost module first."""
    out = []

    def visit(name, mod):
        ps = list({id(p): p for p in mod.parameters()}.values())
        if ps and not any(p.requires_grad for p in ps):
            out.append((name, [n for n, _ in mod.named_parameters()], sum(p.numel() for p in ps), True))
            return
        direct = [(n, p) for n, p in mod.named_parameters(recurse=False) if not p.requires_grad]
        if direct:
            out.append((name, [n for n, _ in direct], sum(p.numel() for _, p in direct), False))
        for cn, child in mod.named_children():
            visit(f"{name}.{cn}" if name else cn, child)

    visit("", model)
    return out


def check_frozen(model, ck: Checklist) -> list[dict]:
    groups = frozen_groups(model)
    total = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    rows = []
    for mod, names, count, whole in groups:
        what = "all parameters" if whole else ", ".join(names)
        if not mod and whole:
            ck.find("frozen", "frozen", "warning", "(root)", f"every parameter of the model is frozen ({count:,})",
                    "set requires_grad=True on the parts you mean to train; an optimizer over them does nothing",
                    verdict="the whole model is frozen")
        else:
            ck.result.add("frozen", "info", _name(mod), f"{what} frozen ({count:,} params)",
                          "if this layer should train: for p in module.parameters(): p.requires_grad_(True)")
        rows.append({"module": _name(mod), "params": count, "frozen": what})
    frozen_total = sum(r["params"] for r in rows)
    if rows:
        ck.row("frozen", "info", f"{frozen_total:,} of {total:,} params frozen in {len(rows)} module(s)",
               ", ".join(r["module"] for r in rows[:4]) + (" …" if len(rows) > 4 else ""),
               "intended? unfreeze with requires_grad_(True)", "frozen")
    else:
        ck.row("frozen", "ok", f"none ({total:,} params trainable)")
    return rows


def input_stats(inputs, ck: Checklist) -> list[dict]:
    import torch

    rows = []
    for name, t in inputs.tensors():
        row = {"input": name, "shape": "x".join(map(str, t.shape)) or "scalar",
               "dtype": str(t.dtype).replace("torch.", ""), "min": None, "max": None, "mean": None, "std": None,
               "non_finite": None}
        rows.append(row)
        if t.device.type == "meta" or t.numel() == 0:
            continue
        x = t.detach()
        xf = x.double() if x.dtype != torch.bool else x.to(torch.float64)
        finite = torch.isfinite(xf)
        bad = int((~finite).sum())
        vals = xf[finite] if bad else xf.reshape(-1)
        row["non_finite"] = bad
        if vals.numel():
            row.update(min=float(vals.min()), max=float(vals.max()), mean=float(vals.mean()),
                       std=float(vals.std()) if vals.numel() > 1 else 0.0)
        if bad:
            ck.find("inputs", "non-finite-input", "error", name, f"{bad:,} of {x.numel():,} values are NaN/Inf",
                    "clean the data (torch.nan_to_num, or drop the samples) before it reaches the model")
        if x.is_floating_point() and _image_like(x) and row["min"] is not None and row["min"] >= 0 and row["max"] > 2.0:
            ck.find("inputs", "unnormalised-input", "warning", name,
                    f"image-like float input with values in [{row['min']:g}, {row['max']:g}] (mean {row['mean']:.4g}): "
                    f"looks like raw pixel values, not normalised",
                    "scale to [0, 1] (ToTensor / x / 255) and normalise with the dataset mean/std (Normalize)")
    if "inputs" not in ck.rows:
        ck.row("inputs", "ok", f"{len(rows)} tensor(s), finite, no raw-pixel range"
               if rows and all(r["min"] is not None for r in rows) else f"{len(rows)} input tensor(s) (no values on meta)")
    return rows


def _image_like(t) -> bool:
    if t.dim() == 4:
        return t.shape[1] in (1, 3, 4) or t.shape[-1] in (1, 3, 4)
    if t.dim() == 3:
        return t.shape[0] in (1, 3, 4) and min(t.shape[1:]) >= 8
    return False


# ---------------------------------------------------------------------------------------------
# Device check on meta
# ---------------------------------------------------------------------------------------------

class DeviceMix(RuntimeError):
    """An op received meta tensors and a non-scalar tensor on another device."""

    def __init__(self, op: str, tensor, creator: str | None, where: str):
        self.op, self.creator, self.where = op, creator, where
        self.shape = "x".join(map(str, tensor.shape))
        self.device = str(tensor.device)
        super().__init__(f"Tensor on device {self.device} is not on the expected device meta! "
                         f"(aten.{op} got a {self.device} tensor of shape {self.shape})")


def _device_guard_mode(tracker):
    """A dispatch mode that raises DeviceMix when an op mixes meta tensors with a non-scalar tensor
    on another device (meta itself lets some through: meta @ cpu works; CUDA would not). It also
    remembers which module's forward created each off-meta tensor, to name the creator."""
    import weakref

    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    import torch

    # ops that legitimately take CPU tensors next to device tensors (explicit moves, CPU-side indices/lengths)
    allowed = {"copy_", "_to_copy", "to", "index", "index_put", "index_put_", "_index_put_impl_", "lift_fresh",
               "lift_fresh_copy", "_local_scalar_dense", "detach", "alias", "clone", "_has_compatible_shallow_copy_type",
               "set_", "tensor_split", "_pack_padded_sequence", "_pad_packed_sequence"}
    created: dict[int, tuple] = {}   # id(tensor) -> (weakref, creating module); tensors compare elementwise

    def current() -> str:
        return tracker._stack[-1][0].name if tracker._stack else ""

    class MixedDeviceGuard(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            op = func.overloadpacket.__name__
            if op not in allowed:
                flat, _ = tree_flatten((args, kwargs))
                ts = [a for a in flat if isinstance(a, torch.Tensor)]
                if any(a.device.type == "meta" for a in ts):
                    other = [a for a in ts if a.device.type != "meta" and a.dim() > 0]
                    if other:
                        raise DeviceMix(op, other[0], _lookup(created, other[0]), current())
            out = func(*args, **kwargs)
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor) and t.device.type != "meta":
                    if _lookup(created, t) is None:
                        created[id(t)] = (weakref.ref(t), current())
            return out

    mode = MixedDeviceGuard()
    mode.created = created
    return mode


def _lookup(created: dict, t) -> str | None:
    entry = created.get(id(t))
    return entry[1] if entry is not None and entry[0]() is t else None


def _creator_of_args(tracker, created) -> tuple[str | None, Any]:
    """For an error raised outside the guard (a module's own device check): the module that
    created an off-meta tensor among the failing module's inputs."""
    import torch
    from torch.utils._pytree import tree_flatten

    if not tracker._stack:
        return None, None
    for a in tree_flatten(list(tracker._stack[-1][1]))[0]:
        if isinstance(a, torch.Tensor) and a.device.type != "meta" and _lookup(created, a) is not None:
            return _lookup(created, a), a
    return None, None


def _rebuild_on_meta(model, opts: Options):
    """The model with its weights on meta: from the factory (the constructor runs normally with
    parameters turned to meta as registered, then .to('meta') — so a plain tensor attribute that
    .to() does not move stays on the CPU, as it would when moving to a GPU); else a copy."""
    from ..core.meta import build_on_meta, params_on_meta

    if opts.factory is not None:
        try:
            with params_on_meta():
                m = opts.factory(**opts.kwargs)
            return m.to("meta"), "factory rebuilt with parameters on meta"
        except Exception:
            try:
                m, how = build_on_meta(opts.factory, opts.kwargs)
                return m, f"factory rebuilt under {how}"
            except Exception:
                pass
    m = copy.deepcopy(model).to("meta")
    return m, "copy of the model moved to meta"


def check_device_meta(model, inputs, opts: Options, ck: Checklist) -> None:
    import torch

    try:
        meta_model, how = _rebuild_on_meta(model, opts)
    except Exception as exc:
        ck.row("device", "skipped", f"could not build the model on meta: {one_line(exc)}")
        return
    meta_inputs = inputs.map(lambda t: torch.empty_like(t, device="meta"))
    for mode in ("eval", "train"):
        meta_model.train(mode == "train")
        tracker = ModuleTracker(meta_model)
        types = {n: type(m).__name__ for n, m in meta_model.named_modules()}
        try:
            guard = _device_guard_mode(tracker)
            with torch.no_grad(), tracker, guard:
                meta_inputs.call(meta_model)
        except Exception as exc:
            call = tracker.failing
            where = call.name if call else ""
            if not isinstance(exc, DeviceMix) and _is_device_error(exc):
                creator, tensor = _creator_of_args(tracker, guard.created)
                if creator is not None:
                    exc = DeviceMix(f"{types.get(where, '?')} input check", tensor, creator, where)
            if isinstance(exc, DeviceMix) and exc.creator is not None:
                culprit = exc.creator
                used = "" if exc.creator == where else f", used in {_name(where)} ({types.get(where, '?')})"
                ck.find("device", "device-mismatch", "error", _name(culprit),
                        f"forward ({mode} mode) of {_name(culprit)} ({types.get(culprit, '?')}) creates a "
                        f"{exc.shape} tensor without device=: it stays on {exc.device} while the model is elsewhere "
                        f"({exc.op if ' ' in exc.op else 'aten.' + exc.op} mixes it with model tensors{used})",
                        "create tensors on the input's device: torch.arange(n, device=x.device), "
                        "x.new_zeros(...), torch.zeros_like(x); or register them as buffers",
                        verdict=f"a tensor created in {_name(culprit)}'s forward ignores the model's device")
                return
            if _is_device_error(exc):
                ck.find("device", "device-mismatch", "error", _name(where),
                        f"forward ({mode} mode) in {_name(where)} ({call.type if call else '?'}) mixes devices: "
                        f"a tensor that .to(device) does not move (made outside forward, most likely a plain tensor "
                        f"attribute rather than a buffer) stays on the CPU ({one_line(exc)})",
                        "register constant tensors with self.register_buffer(name, t) so model.to(device) moves "
                        "them; create tensors in forward with device=x.device",
                        verdict=f"{_name(where)} uses a tensor that does not follow the model's device")
                return
            if mode == "train":
                ck.row("device", "ok", f"no off-device tensor in eval-mode forward (meta run; train mode raised "
                       f"there: {one_line(exc, 80)})")
                return
            ck.row("device", "skipped", f"forward on meta not possible ({mode} mode, {_name(where)}): "
                   f"{one_line(exc, 120)}", _name(where) if call else "",
                   "data-dependent ops (.item(), nonzero) cannot run on meta; run with --device cuda to check for real")
            return
    if "device" not in ck.rows:
        ck.row("device", "ok", "no off-device tensor in forward (meta run)")
        ck.result.data["meta_build"] = how


# ---------------------------------------------------------------------------------------------
# Eval determinism: record per-call fingerprints, name the first module that turns equal inputs
# into different outputs
# ---------------------------------------------------------------------------------------------

def _fingerprint(obj) -> list[float]:
    import torch

    vals = []
    for _, t in _tensors(obj):
        if t.numel() == 0 or t.dtype == torch.bool:
            continue
        x = t.detach().double()
        vals.append(torch.stack([x.nansum(), x.abs().nansum()]))
    return torch.cat(vals).tolist() if vals else []


def _same_fp(a: list[float], b: list[float]) -> bool:
    if len(a) != len(b):
        return False
    for i in range(0, len(a), 2):
        s1, s2, m1, m2 = a[i], b[i], a[i + 1], b[i + 1]
        scale = max(abs(m1), abs(m2)) * 1e-6 + 1e-12
        if abs(s1 - s2) > scale or abs(m1 - m2) > scale:
            return False
    return True


class CallRecorder(ForwardHooks):
    pre_kwargs = True

    def __init__(self, model):
        super().__init__(model)
        self.done: list[tuple[str, str, list, list]] = []   # completion order
        self._stack: list = []

    def _pre(self, mod, args, kwargs):
        self._stack.append(_fingerprint((args, kwargs)))

    def _post(self, mod, args, output):
        fin = self._stack.pop() if self._stack else []
        self.done.append((self.names.get(id(mod), "?"), type(mod).__name__, fin, _fingerprint(output)))


def _max_diff(a, b) -> float | None:
    ta, tb = _tensors(a), _tensors(b)
    if len(ta) != len(tb):
        return None
    m = 0.0
    for (_, x), (_, y) in zip(ta, tb):
        if x.shape != y.shape:
            return None
        if x.is_floating_point():
            m = max(m, float((x.detach().double() - y.detach().double()).abs().nan_to_num(0.0).max()) if x.numel() else 0.0)
        elif not (x == y).all():
            m = max(m, float("inf"))
    return m


def _scale(obj) -> float:
    return max((float(t.detach().double().abs().max()) for _, t in _tensors(obj) if t.is_floating_point() and t.numel()),
               default=0.0)


def check_determinism(work, inputs, out1, ck: Checklist) -> None:
    import torch

    work.eval()
    runs = []
    outs = []
    for _ in range(2):
        rec = CallRecorder(work)
        with torch.no_grad(), rec:
            outs.append(run_forward(work, inputs, phase="forward (eval mode, determinism check)"))
        runs.append(rec.done)
    diff = _max_diff(outs[0], outs[1])
    if diff == 0.0:
        ck.row("determinism", "ok", "two eval runs are bit-identical")
        return
    scale = _scale(outs[0])
    if diff is not None and diff <= 1e-6 * scale + 1e-9:
        ck.row("determinism", "ok", f"two eval forwards agree to {diff:.1e} (floating-point reduction order)")
        return
    a, b = runs
    culprit, kind = "", ""
    for (n1, t1, in1, o1), (n2, _t2, in2, o2) in zip(a, b):
        if n1 != n2:
            culprit, kind = n1, t1
            break
        if _same_fp(in1, in2) and not _same_fp(o1, o2):
            culprit, kind = n1, t1
            break
    what = "different outputs" + (f" (max abs difference {diff:.4g})" if diff not in (None, float("inf")) else "")
    ck.find("determinism", "nondeterministic-eval", "error", _name(culprit),
            f"in eval mode the same input gives {what}; {_name(culprit)} ({kind or '?'}) is the first module whose "
            f"output changes while its input does not",
            "randomness in eval: use self.training to gate it (F.dropout(x, p, training=self.training)), "
            "no torch.rand/randn in forward outside training",
            verdict=f"eval output changes between two runs: {_name(culprit)}")


# ---------------------------------------------------------------------------------------------
# In-place edits that break autograd
# ---------------------------------------------------------------------------------------------

class InplaceLocator(ForwardHooks):
    """Forward hooks + saved-tensor hooks: a tensor saved for backward whose version counter
    moved between two hook events was edited in place by the module running in between."""

    def __init__(self, model):
        super().__init__(model)
        self.stack: list[tuple[str, str]] = []
        self.saved: dict[int, tuple] = {}
        self.found: list[tuple[str, str, str, str]] = []  # (culprit, type, saved by, shape)
        self._ctx = None

    def _scan(self):
        if not self.saved:
            return
        where = self.stack[-1] if self.stack else ("", "")
        for key in list(self.saved):
            t, version, saver = self.saved[key]
            if t._version != version:
                self.found.append((where[0], where[1], saver, "x".join(map(str, t.shape))))
                del self.saved[key]

    def _pre(self, mod, args):
        self._scan()
        self.stack.append((self.names.get(id(mod), "?"), type(mod).__name__))

    def _post(self, mod, args, out):
        self._scan()
        if self.stack:
            self.stack.pop()

    def _pack(self, t):
        saver = self.stack[-1][0] if self.stack else ""
        self.saved.setdefault(id(t), (t, t._version, saver))
        return t

    def __enter__(self):
        import torch

        super().__enter__()
        self._ctx = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self._ctx.__enter__()
        return self

    def __exit__(self, *exc):
        self._ctx.__exit__(*exc)
        super().__exit__(*exc)
        self._scan()
        return False


def _report_inplace(ck: Checklist, culprit: str, kind: str, saver: str, shape: str, exc) -> None:
    saved = f"; the tensor ({shape}) was saved for backward by {_name(saver)}" if saver is not None else ""
    ck.find("inplace", "inplace-autograd", "error", _name(culprit),
            f"{_name(culprit)} ({kind}) edits in place a tensor autograd still needs{saved} ({one_line(exc, 160)})",
            "use the out-of-place form (x = x + y, not x += y; relu(inplace=False); x = x.clone() before editing)",
            verdict=f"backward fails: {_name(culprit)} edits a saved tensor in place")


# ---------------------------------------------------------------------------------------------
# Train mode: forward + backward + one step
# ---------------------------------------------------------------------------------------------

def mode_modules(model) -> list[tuple[str, str]]:
    from torch import nn
    from torch.nn.modules.batchnorm import _BatchNorm
    from torch.nn.modules.dropout import _DropoutNd
    from torch.nn.modules.instancenorm import _InstanceNorm

    out = []
    for n, m in model.named_modules():
        if isinstance(m, (_DropoutNd, nn.AlphaDropout, nn.FeatureAlphaDropout)) and getattr(m, "p", 0) > 0:
            out.append((n, type(m).__name__))
        elif isinstance(m, _BatchNorm) or (isinstance(m, _InstanceNorm) and m.track_running_stats):
            out.append((n, type(m).__name__))
        elif isinstance(m, nn.MultiheadAttention) and m.dropout > 0:
            out.append((n, type(m).__name__))
    return out


def _bn_modules(model) -> list[str]:
    from torch.nn.modules.batchnorm import _BatchNorm

    return [n for n, m in model.named_modules() if isinstance(m, _BatchNorm)]


def train_checks(work, inputs, opts: Options, loss, eval_out, ck: Checklist, result: Result) -> None:
    import torch

    mods = mode_modules(work)
    batch = inputs.batch_size
    work.train()
    for p in work.parameters():
        p.grad = None
    tracker = ModuleTracker(work, record_shapes=False)
    try:
        with torch.enable_grad(), tracker:
            out = inputs.call(work)
    except Exception as exc:
        call = tracker.failing
        where = call.name if call else ""
        if _is_bn_batch_error(exc):
            ck.find("batchnorm", "batchnorm-batch-1", "error", _name(where),
                    f"{_name(where)} ({call.type if call else 'BatchNorm'}) raises in train mode with batch size "
                    f"{batch}: BatchNorm needs more than one value per channel to compute batch statistics",
                    "train with batches of 2 or more (DataLoader(drop_last=True) avoids a last batch of 1), "
                    "or use GroupNorm/LayerNorm",
                    verdict=f"train-mode forward fails at batch size {batch} in {_name(where)}")
            batched = [t for _, t in inputs.tensors() if t.dim() and t.shape[0] == 1]
            if batch == 1 and getattr(loss, "target", None) is None and batched and \
                    all(t.is_floating_point() for t in batched):
                # a second, perturbed sample (an exact duplicate would make BatchNorm's variance 0)
                g = torch.Generator(device=batched[0].device).manual_seed(opts.seed)

                def two(t):
                    if not (t.dim() and t.shape[0] == 1):
                        return t
                    noise = torch.randn(t.shape, generator=g, device=t.device, dtype=t.dtype)
                    return torch.cat([t, t + noise * (t.detach().float().std().nan_to_num(1.0).clamp_min(1e-3))
                                      .to(t.dtype)])

                result.notes.append("batch size 1 fails in train mode: the other training checks ran on a batch "
                                    "of 2 (the sample and a perturbed copy)")
                return train_checks(work, inputs.map(two), opts, loss, eval_out, ck, result)
        elif _is_inplace_error(exc):
            _report_inplace(ck, where, call.type if call else "?", None, "", exc)
        else:
            raise forward_error(exc, tracker, "forward in train mode") from exc
        for check in ("modes", "inplace", "update"):
            if check not in ck.rows:
                ck.row(check, "skipped", f"train-mode forward fails ({_name(where)})")
        return

    # train/eval-dependent modules
    diff = _max_diff(eval_out, out)
    dtxt = "" if diff is None else f" (max |train − eval| output difference {diff:.4g})"
    if mods:
        names = ", ".join(f"{_name(n)} ({t})" for n, t in mods[:6]) + (" …" if len(mods) > 6 else "")
        result.add("mode-dependent", "info", ", ".join(_name(n) for n, _ in mods[:6]),
                   f"outputs differ between train and eval mode because of {names}{dtxt}", MODE_TYPES_HINT)
        ck.row("modes", "info", f"{len(mods)} module(s) behave differently in train and eval{dtxt}",
               ", ".join(_name(n) for n, _ in mods[:4]) + (" …" if len(mods) > 4 else ""), MODE_TYPES_HINT,
               "mode-dependent")
    elif diff is not None and diff > 1e-5 * _scale(eval_out) + 1e-6:   # beyond kernel-choice rounding
        if ck.has_error("determinism"):
            # eval differs from itself: a train/eval difference says nothing about self.training
            ck.row("modes", "skipped", "no Dropout/BatchNorm; train and eval outputs cannot be compared: the eval "
                   "output is random (see eval determinism)")
        else:
            result.add("mode-dependent", "info", "(root)",
                       f"no Dropout/BatchNorm, yet train and eval outputs differ{dtxt}: forward code reads self.training",
                       MODE_TYPES_HINT)
            ck.row("modes", "info", f"train and eval outputs differ{dtxt} (custom self.training code)", "(root)",
                   MODE_TYPES_HINT, "mode-dependent")
    else:
        ck.row("modes", "ok", "no Dropout/BatchNorm; train = eval output")

    # backward
    try:
        value = loss(out)
    except ModelError:
        raise
    if not getattr(value, "requires_grad", False):
        # no graph to run backward through: nothing trainable reached the loss
        trainable = any(p.requires_grad for p in work.parameters())
        why = ("no trainable parameters" if not trainable else
               "the loss does not depend on any trainable parameter (no grad_fn)")
        hint = "" if not trainable else "see torchdiag gradflow for where the graph is cut (detached output)"
        ck.row("inplace", "skipped", why, hint=hint)
        ck.row("update", "skipped", why, hint=hint)
        return
    try:
        value.backward()
        backward_error = None
    except Exception as exc:
        backward_error = exc
    if backward_error is not None:
        if not _is_inplace_error(backward_error):
            raise ModelError(f"backward failed: {one_line(backward_error)}",
                             hint="the model's own code raised in backward; run with --debug for the traceback") from backward_error
        locate_inplace(work, inputs, ck, backward_error)
        ck.row("update", "skipped", "backward fails (see in-place check)")
        return
    ck.row("inplace", "ok", "backward runs")

    update_check(work, inputs, opts, ck, result)


def locate_inplace(work, inputs, ck: Checklist, exc) -> None:
    import torch

    work.train()
    loc = InplaceLocator(work)
    with torch.enable_grad(), loc:
        run_forward(work, inputs, phase="forward in train mode (locating the in-place edit)")
    if loc.found:
        culprit, kind, saver, shape = loc.found[0]
        _report_inplace(ck, culprit, kind, saver, shape, exc)
    else:
        _report_inplace(ck, "", "?", None, "", exc)


def update_check(work, inputs, opts: Options, ck: Checklist, result: Result) -> None:
    import torch

    named = list({id(p): (n, p) for n, p in work.named_parameters()}.values())
    trainable = [(n, p) for n, p in named if p.requires_grad]
    with_grad = [(n, p) for n, p in trainable if p.grad is not None]
    no_grad = [n for n, p in trainable if p.grad is None]
    if not with_grad:
        ck.row("update", "skipped", "no parameter received a gradient")
        return
    before = {n: p.detach().clone() for n, p in with_grad}
    zero = {n for n, p in with_grad if not bool(p.grad.detach().ne(0).any())}
    opt = torch.optim.Adam([p for _, p in with_grad], lr=opts.lr)
    opt.step()
    after_step = {n: p.detach().clone() for n, p in with_grad}
    with torch.no_grad():
        run_forward(work, inputs, phase="forward after one optimizer step")
    current = dict(work.named_parameters())
    bad = []
    for n, p in with_grad:
        now = current.get(n, p).detach()
        if n in zero:
            bad.append((n, f"receives a gradient, but it is all zeros (a hook, mask or multiplication by 0 "
                           f"wipes it), so the optimizer step leaves it unchanged",
                        "find what zeroes the gradient (p.register_hook, grad masks, * 0); freeze it on purpose "
                        "with requires_grad_(False) if it is not meant to train"))
        elif torch.equal(after_step[n], before[n]):
            bad.append((n, "receives a nonzero gradient but the optimizer step does not change it",
                        "check that the optimizer holds this parameter (re-created parameters are not in it)"))
        elif now.shape != after_step[n].shape or not torch.equal(now, after_step[n]):
            reset = now.shape == before[n].shape and torch.equal(now, before[n])
            bad.append((n, "changes after the optimizer step, but the next forward " +
                        ("writes the old value back" if reset else "overwrites it") +
                        " (the forward assigns to the parameter)",
                        "do not assign to parameters in forward (.data =, .copy_, fill_); compute a new tensor "
                        "from the parameter instead"))
    for n, msg, hint in bad[:50]:
        ck.find("update", "param-not-updated", "error", n, f"{n} {msg}", hint,
                verdict=f"{len(bad)} parameter(s) get a gradient but do not change after a step")
    if len(bad) > 50:
        result.notes.append(f"{len(bad) - 50} more param-not-updated parameters not listed")
    if not bad:
        extra = f"; {len(no_grad)} trainable parameter(s) got no gradient (see torchdiag gradflow)" if no_grad else ""
        ck.row("update", "ok", f"{len(with_grad)}/{len(with_grad)} params change after 1 Adam step{extra}")
    result.data["params_without_grad"] = no_grad


def bn_batch1_probe(work, inputs, ck: Checklist) -> None:
    import torch

    bns = _bn_modules(work)
    batch = inputs.batch_size
    if "batchnorm" in ck.rows:
        return
    if not bns:
        ck.row("batchnorm", "ok", "no BatchNorm modules")
        return
    if batch is None or batch <= 1:
        ck.row("batchnorm", "ok", f"train-mode forward works with batch size {batch}")
        return
    work.train()
    tracker = ModuleTracker(work, record_shapes=False)
    try:
        with torch.no_grad(), tracker:
            _batch_one(inputs, batch).call(work)
    except Exception as exc:
        call = tracker.failing
        where = call.name if call else ""
        if _is_bn_batch_error(exc):
            ck.find("batchnorm", "batchnorm-batch-1", "warning", _name(where),
                    f"with a batch of 1 (e.g. the last batch of an epoch) {_name(where)} raises in train mode: "
                    f"BatchNorm needs more than one value per channel",
                    "DataLoader(drop_last=True) avoids a last batch of 1; or use GroupNorm/LayerNorm",
                    verdict=f"a batch of 1 fails in train mode in {_name(where)} (batch {batch} works)")
            return
        ck.row("batchnorm", "skipped", f"batch-1 probe failed for another reason: {one_line(exc, 100)}")
        return
    ck.row("batchnorm", "ok", f"{len(bns)} BatchNorm module(s); train mode works even with batch size 1")


# ---------------------------------------------------------------------------------------------
# Targets
# ---------------------------------------------------------------------------------------------

def check_target(eval_out, loss, target, ck: Checklist) -> bool:
    """True when the class targets cannot be used with this output (training then uses random targets)."""
    import torch

    from ..core.loss import primary_output

    if target is None or not isinstance(target, torch.Tensor):
        ck.row("target", "ok" if target is None else "skipped",
               "no targets given (random valid ones used)" if target is None
               else f"target is a {type(target).__name__}")
        return False
    if target.is_floating_point() or target.dtype == torch.bool:
        ck.row("target", "ok", f"{str(target.dtype).replace('torch.', '')} target (not class indices)")
        return False
    if loss is not None and loss.kind not in ("auto", "cross_entropy"):
        ck.row("target", "skipped", f"loss '{loss.kind}' does not take class indices")
        return False
    try:
        y, picked = primary_output(eval_out)
    except Exception:
        ck.row("target", "skipped", "no tensor output to compare targets with")
        return False
    if y.dim() < 2:
        ck.row("target", "skipped", f"output {describe(y)} has no class dimension")
        return False
    classes = int(y.shape[1])
    t = target.detach()
    valid = t[t != -100]
    if valid.numel() == 0:
        ck.row("target", "ok", "all targets are ignore_index (-100)")
        return False
    lo, hi = int(valid.min()), int(valid.max())
    bad = int(((valid < 0) | (valid >= classes)).sum())
    if bad:
        ck.find("target", "target-out-of-range", "error", picked,
                f"class targets span [{lo}, {hi}] but {picked} has {classes} classes (valid 0…{classes - 1}); "
                f"{bad:,} of {valid.numel():,} targets are out of range",
                ("labels look 1-based: subtract 1" if lo >= 1 and hi == classes else
                 f"make labels 0…{classes - 1}, or give the last layer {hi + 1} outputs"),
                verdict=f"targets reach {hi} but the output has {classes} classes" if hi >= classes
                else f"negative targets ({lo})")
        return True
    ck.row("target", "ok", f"class targets in [{lo}, {hi}], output has {classes} classes")
    return False


# ---------------------------------------------------------------------------------------------
# run
# ---------------------------------------------------------------------------------------------

def run(model, inputs, opts: Options | None = None) -> Result:
    import torch

    from ..core.loss import Loss

    opts = opts or Options()
    loss = opts.loss if opts.loss is not None else Loss("auto", opts.seed, opts.batch_target)
    target = opts.batch_target if opts.batch_target is not None else getattr(loss, "target", None)
    result = Result("doctor")
    ck = Checklist(result)
    try:
        with leave_no_trace(model):
            _run(model, inputs, opts, loss, target, ck, result)
    except ModelError as exc:
        if result.tables and result.tables[0].key == "checks":
            result.tables[0] = ck.table()
        else:
            result.tables.insert(0, ck.table())
        exc.partial = exc.partial or result
        raise
    return result


def _run(model, inputs, opts, loss, target, ck: Checklist, result: Result) -> None:
    import torch

    on_meta = any(t.device.type == "meta" for t in list(model.parameters()) + list(model.buffers())) or \
        any(t.device.type == "meta" for _, t in inputs.tensors())

    check_device_spread(model, ck)
    main_dtype = check_dtypes(model, inputs, ck)
    frozen_rows = check_frozen(model, ck)
    stats = input_stats(inputs, ck)
    check_device_meta(model, inputs, opts, ck)

    result.tables.append(ck.table())  # replaced at the end; keeps the slot first
    result.tables.append(Table("input_stats", "Inputs", [
        Column("input", "input"), Column("shape", "shape"), Column("dtype", "dtype"), Column("min", "min", "float"),
        Column("max", "max", "float"), Column("mean", "mean", "float"), Column("std", "std", "float"),
        Column("non_finite", "non-finite", "count")], stats))
    if frozen_rows:
        result.tables.append(Table("frozen_params", "Frozen parameters by module", [
            Column("module", "module"), Column("params", "params", "count"), Column("frozen", "frozen")],
            frozen_rows))

    def finish():
        result.tables[0] = ck.table()
        errors = [f for f in result.findings if f.severity == "error"]
        warns = [f for f in result.findings if f.severity == "warning"]
        result.verdict = (f"FAIL: {len(errors)} error(s): " + ", ".join(sorted({f.code for f in errors}))
                          if errors else f"PASS with {len(warns)} warning(s)" if warns else "PASS")

    if on_meta:
        for check in ("inplace", "modes", "batchnorm", "determinism", "update", "target"):
            ck.row(check, "skipped", "model or inputs on meta: no values to run")
        finish()
        return

    with workspace(model) as work:
        work.eval()
        tracker = ModuleTracker(work, record_shapes=True)
        try:
            with torch.no_grad(), tracker:
                eval_out = inputs.call(work)
        except Exception as exc:
            call = tracker.failing
            explained = ck.has_error("device", "dtype") and (_is_device_error(exc) or _is_dtype_error(exc))
            if not explained:
                result.tables[0] = ck.table()
                raise forward_error(exc, tracker, "forward (eval mode)", partial=result) from exc
            result.add("forward-fails", "error", _name(call.name if call else ""),
                       f"the forward pass fails as the checks above predict: {one_line(exc, 200)}",
                       "fix the findings above")
            for check in ("inplace", "modes", "batchnorm", "determinism", "update", "target"):
                if check not in ck.rows:
                    ck.row(check, "skipped", "forward fails (see device/dtype findings)")
            finish()
            return

        # silent dtype promotion: a float64 parameter turns a float32 model's output float64
        outs = [t for _, t in _tensors(eval_out) if t.is_floating_point()]
        if main_dtype and outs and str(outs[0].dtype).replace("torch.", "") != main_dtype:
            odt = str(outs[0].dtype).replace("torch.", "")
            minority = [f for f in result.findings if f.code == "dtype-mismatch" and f.severity == "warning"]
            for f in minority:
                f.severity = "error"
                f.message += f"; it silently promotes the output to {odt}"
            if minority:
                ck.rows["dtype"].update(status="error", _style=_STYLE["error"],
                                        verdict=f"the output is {odt} while the parameters are mostly {main_dtype}: "
                                                f"{', '.join(f.where for f in minority[:3])} promote(s) it")
        result.data["output"] = describe(eval_out)

        check_determinism(work, inputs, eval_out, ck)
        bad_target = check_target(eval_out, loss, target, ck)
        train_loss = loss
        if bad_target:
            from ..core.loss import Loss

            train_loss = Loss("auto", opts.seed)
            result.notes.append("training checks used random class targets: the given targets are out of range")
        train_checks(work, inputs, opts, train_loss, eval_out, ck, result)
        if train_loss.chosen:
            result.header["loss"] = train_loss.describe()
        bn_batch1_probe(work, inputs, ck)
    finish()
