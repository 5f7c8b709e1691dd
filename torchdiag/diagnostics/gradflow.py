"""gradflow: does the gradient reach every parameter, and in what shape?

One forward+backward (train mode unless `eval_mode`), on the user's model in place: `.grad`
tensors are set aside before backward and put back after (leave_no_trace), buffers that the
train-mode forward updates (BatchNorm running stats) are copied back bit for bit.

Per parameter: shape, grad norm, weight norm, grad/weight ratio, mean and max |grad| and a status
(priority order): non-finite-grad, no-grad (unused | detached), zero-grad, exploding-grad,
vanishing-grad, frozen, ok.

Why a parameter got no gradient is worked out from the forward pass, not guessed:
- forward hooks record which modules ran and the autograd node of every tensor they returned;
- after the loss, the autograd graph is walked from the loss node: a module whose output nodes
  are not in that graph ran but did not reach the loss (`.detach()`, an int cast, `torch.no_grad()`);
- a parameter whose module never ran is "unused"; one whose module ran and reached the loss but
  still got no gradient was not used (or was detached) inside that module's forward.

Activation health comes from the same forward: mean/std of module outputs, exact zeros and dead
units after ReLU-family modules (a unit = one output position; dead = zero for every sample of
the batch), saturated fraction after tanh/sigmoid-family modules. Functional activations
(F.relu inside forward) are not modules and are not seen."""
from __future__ import annotations

import fnmatch
import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from ..core.guard import leave_no_trace
from ..core.tracking import ForwardHooks, ModuleTracker, describe, forward_error
from ..errors import ModelError, UsageError, one_line
from ..results import Column, Result, Table

# status → (severity when flagged, fails without --strict)
STATUS_SEVERITY = {
    "non-finite-grad": "error", "no-grad": "error", "zero-grad": "error", "exploding-grad": "error",
    "vanishing-grad": "warning", "frozen": "info", "ok": None,
}
STATUS_ORDER = ["non-finite-grad", "no-grad", "zero-grad", "exploding-grad", "vanishing-grad", "ok", "frozen"]

RELU_FAMILY = ("ReLU", "ReLU6", "Threshold", "Hardswish")
SATURATING = ("Tanh", "Sigmoid", "Hardtanh", "ReLU6", "Hardsigmoid")


@dataclass
class Options:
    loss: Any = None                 # core.loss.Loss; None → sum of the primary output
    depth: int = 3
    vanishing: float = 1e-7          # grad/weight ratio (grad norm when the weight is all zeros) below → vanishing
    exploding: float = 1e3           # grad norm above → exploding
    exploding_ratio: float = 1e2     # grad/weight ratio above → exploding
    dead: float = 0.5                # fraction of dead units after a ReLU-family module → warning
    saturated: float = 0.5           # fraction of saturated outputs after tanh/sigmoid → warning
    saturation_margin: float = 0.01  # tanh |y| > 1 - m, sigmoid y < m or y > 1 - m
    allow: list[str] = field(default_factory=list)
    strict: bool = False
    eval_mode: bool = False
    histograms: bool = False         # fill result.histograms (for --tb)


# --------------------------------------------------------------------------- forward recording

@dataclass
class _Act:
    """Running activation statistics of one module over all its calls (tensors, summed lazily)."""
    kind: str                      # relu | saturating | relu+saturating | other
    n: list = field(default_factory=list)
    s: list = field(default_factory=list)       # per-call sum
    ss: list = field(default_factory=list)      # per-call L2 norm
    zeros: list = field(default_factory=list)
    dead: list = field(default_factory=list)
    units: int = 0
    sat: list = field(default_factory=list)
    shape: str = ""


class _Recorder(ForwardHooks):
    """Forward hooks: execution order, grad mode, output autograd nodes, activation statistics."""

    def __init__(self, model, stats_for: set[str], margin: float):
        super().__init__(model)
        self.stats_for = stats_for
        self.margin = margin
        self.order: dict[str, int] = {}
        self.types: dict[str, str] = {}
        self.nodes: dict[str, list] = defaultdict(list)        # module → grad_fn of each output tensor (None: no graph)
        self.grad_enabled: dict[str, bool] = {}
        self.acts: dict[str, _Act] = {}

    def _pre(self, mod, args):
        name = self.names.get(id(mod), "?")
        self.order.setdefault(name, len(self.order))
        self.types[name] = type(mod).__name__

    def _post(self, mod, args, output):
        import torch

        name = self.names.get(id(mod), "?")
        enabled = torch.is_grad_enabled()
        self.grad_enabled[name] = self.grad_enabled.get(name, False) or enabled
        tensors = _float_tensors(output)
        for t in tensors:
            self.nodes[name].append(t.grad_fn if t.requires_grad else None)
        if name in self.stats_for and tensors:
            self._stats(name, mod, tensors[0])

    def _stats(self, name, mod, y):
        import torch

        y = y.detach()
        cls = _kinds(mod)
        act = self.acts.get(name)
        if act is None:
            act = self.acts[name] = _Act(cls, shape=describe(y))
        yf = y if y.dtype in (torch.float32, torch.float64) else y.float()
        act.n.append(yf.numel())
        act.s.append(yf.sum())
        act.ss.append(torch.linalg.vector_norm(yf))     # sqrt(sum y^2), without a y*y temporary
        if "relu" in cls:
            zero = yf == 0
            act.zeros.append(zero.sum())
            if y.dim() >= 2 and y.shape[0] > 1:
                act.dead.append(zero.reshape(y.shape[0], -1).all(0).sum())
                act.units += y[0].numel()
            else:
                act.dead.append(zero.sum())
                act.units += y.numel()
        if "saturating" in cls:
            act.sat.append(_saturated(mod, yf, self.margin))


def _kinds(mod) -> str:
    from torch import nn

    kinds = []
    if isinstance(mod, (nn.ReLU, nn.ReLU6, nn.Threshold, nn.Hardswish)):
        kinds.append("relu")
    if isinstance(mod, (nn.Tanh, nn.Sigmoid, nn.Hardtanh, nn.Hardsigmoid)):
        kinds.append("saturating")
    return "+".join(kinds) or "other"


def _saturated(mod, y, m):
    from torch import nn

    if isinstance(mod, nn.Tanh):
        return (y.abs() > 1 - m).sum()
    if isinstance(mod, (nn.Sigmoid, nn.Hardsigmoid)):
        return ((y < m) | (y > 1 - m)).sum()
    # Hardtanh / ReLU6: flat beyond its bounds
    return ((y <= mod.min_val) | (y >= mod.max_val)).sum()


def _float_tensors(obj) -> list:
    import torch

    out = []
    if isinstance(obj, torch.Tensor):
        if obj.is_floating_point() or obj.is_complex():
            out.append(obj)
    elif isinstance(obj, (tuple, list)):
        for x in obj:
            out.extend(_float_tensors(x))
    elif isinstance(obj, dict) or hasattr(obj, "values") and hasattr(obj, "keys"):
        for x in obj.values():
            out.extend(_float_tensors(x))
    return out


def _reachable(root) -> set[int]:
    """ids of every autograd node reachable from the loss node."""
    seen: set[int] = set()
    stack = [root] if root is not None else []
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        for nxt, _ in node.next_functions:
            if nxt is not None and id(nxt) not in seen:
                stack.append(nxt)
    return seen


# --------------------------------------------------------------------------- helpers

def _owner(name: str) -> str:
    return name.rpartition(".")[0]


def _ancestors(path: str) -> list[str]:
    """'a.b.c' → ['a.b.c', 'a.b', 'a', ''] (innermost first)."""
    out = [path]
    while path:
        path = _owner(path)
        out.append(path)
    return out


def _label(path: str) -> str:
    return path or "(root)"


def frontier(model, depth: int) -> list[tuple[str, bool]]:
    """The modules shown as layers: (path, own_only). A module with parameters somewhere below it
    is a layer at `depth`, or shallower when no child holds parameters; a shallower module that
    holds parameters of its own next to parameterised children gets an `own` row."""
    mods = dict(model.named_modules())
    has = {n: any(True for _ in m.parameters()) for n, m in mods.items()}
    own = {n: any(True for _ in m.parameters(recurse=False)) for n, m in mods.items()}
    out = []
    for name, mod in mods.items():
        d = name.count(".") + 1 if name else 0
        if d > depth or not has[name]:
            continue
        children_with = any(has.get(f"{name}.{c}" if name else c, False) for c, _ in mod.named_children())
        if d == depth or not children_with:
            out.append((name, False))
        elif own[name]:
            out.append((name, True))
    return out


def _log_bar(value, lo, hi, width=12) -> str:
    from ..render.fmt import bar

    if value is None or not math.isfinite(value):
        return "!" * 3 if value is not None else ""
    if value <= 0:
        return "·"
    frac = 1.0 if hi <= lo else (math.log10(value) - lo) / (hi - lo)
    return bar(max(frac, 0.02), width).rstrip()


# --------------------------------------------------------------------------- the run

def run(model, inputs, opts: Options | None = None) -> Result:
    import torch

    opts = opts or Options()
    result = Result("gradflow")
    devices = {p.device.type for p in model.parameters()} | {t.device.type for _, t in inputs.tensors()}
    if "meta" in devices:
        raise UsageError("gradflow needs real values; meta tensors have none",
                         hint="use --device cpu or cuda")
    result.header["mode"] = ("eval" if opts.eval_mode else "train") + " mode, one forward + backward"
    names = [n for n, _ in model.named_parameters()]          # unique tensors (ties once)
    params = dict(model.named_parameters())
    modules = dict(model.named_modules())
    layers = frontier(model, opts.depth)
    stats_for = {n for n, m in modules.items() if _kinds(m) != "other"}
    stats_for |= {n for n, m in modules.items()
                  if n and n.count(".") + 1 <= opts.depth and not any(True for _ in m.children())}

    rec = _Recorder(model, stats_for, opts.saturation_margin)
    tracker = ModuleTracker(model, record_shapes=False)
    grads: dict[str, Any] = {}
    loss_fn = opts.loss
    with leave_no_trace(model, buffers=True):
        model.train(not opts.eval_mode)
        torch.set_grad_enabled(True)
        for p in params.values():
            p.grad = None
        with rec, tracker:
            try:
                output = inputs.call(model)
            except ModelError:
                raise
            except Exception as exc:
                raise forward_error(exc, tracker) from exc
        if loss_fn is None:
            from ..core.loss import Loss

            loss_fn = Loss("sum")
        loss = loss_fn(output)
        result.header["loss"] = loss_fn.describe()
        loss_value = float(loss.detach().float())
        reach = _reachable(loss.grad_fn)
        if loss.requires_grad:
            try:
                loss.backward()
            except Exception as exc:
                raise ModelError(f"backward failed: {one_line(exc)}",
                                 hint="the model's own code raised in backward") from exc
        for n, p in params.items():
            grads[n] = p.grad
            p.grad = None
        del loss, output

    # --- per parameter
    rows = []
    stat_vecs = []
    dense: dict[str, Any] = {}
    for n in names:
        p, g = params[n], grads[n]
        w = p.detach()
        vec = [torch.linalg.vector_norm(w, dtype=torch.float32)]
        if g is not None:
            g = (g.coalesce()._values() if g.is_sparse else g).detach()
            dense[n] = g
            # L2, L1 (sum |g|) and L-inf (max |g|) norms: one reduction each, no temporaries
            vec += [torch.linalg.vector_norm(g, ord=o, dtype=torch.float32) if g.numel() else w.new_zeros((), dtype=torch.float32)
                    for o in (2, 1, math.inf)]
        stat_vecs.append(torch.stack([v.reshape(()).float().to(w.device) for v in vec]))
    values = [v.cpu().tolist() for v in stat_vecs]
    for n, vals in zip(names, values):
        # NaN/Inf counts only where a norm is not finite (a finite L1 norm means all values are finite)
        if n in dense and not all(math.isfinite(v) for v in vals[1:]):
            g = dense[n]
            vals += [int(torch.isnan(g).sum()), int(torch.isinf(g).sum())]
        elif n in dense:
            vals += [0, 0]

    ran = set(rec.order)
    for n, vals in zip(names, values):
        p = params[n]
        row = {"name": n, "module": _owner(n), "shape": list(p.shape), "numel": p.numel(),
               "requires_grad": p.requires_grad, "weight_norm": vals[0], "grad_norm": None,
               "grad_weight_ratio": None, "mean_abs_grad": None, "max_abs_grad": None,
               "nan": 0, "inf": 0, "status": "ok", "reason": None, "allowed": False}
        if grads[n] is not None:
            gnorm, asum, amax, nan, inf = vals[1:]
            row.update(grad_norm=gnorm, mean_abs_grad=asum / max(p.numel(), 1), max_abs_grad=amax, nan=nan, inf=inf)
            if vals[0] > 0 and math.isfinite(gnorm):
                row["grad_weight_ratio"] = gnorm / vals[0]
            row["status"] = _status(row, opts)
        elif not p.requires_grad:
            row["status"] = "frozen"
        else:
            row["status"] = "no-grad"
            row["reason"], row["why"] = _why(n, rec, reach, ran, modules)
        row["allowed"] = row["status"] not in ("ok", "frozen") and any(fnmatch.fnmatchcase(n, pat) for pat in opts.allow)
        rows.append(row)

    _param_findings(result, rows, model, opts)
    if not math.isfinite(loss_value):
        result.add("non-finite-loss", "error", "", f"the loss is {loss_value} before backward; every gradient "
                   "downstream of it is non-finite", hint="run `torchdiag nancheck` to find where it first goes bad")

    # --- layers
    layer_rows = _layer_rows(layers, rows, rec, modules)
    finite = [r["mean_abs_grad"] for r in layer_rows if r["mean_abs_grad"] and math.isfinite(r["mean_abs_grad"])]
    lo, hi = (math.log10(min(finite)), math.log10(max(finite))) if finite else (0.0, 0.0)
    if hi - lo < 1:
        lo = hi - 1
    for r in layer_rows:
        r["_bar"] = _log_bar(r["mean_abs_grad"], lo, hi)

    # --- activations
    act_rows = _activation_rows(rec, modules, opts, result)

    counts = defaultdict(int)
    for r in rows:
        counts[r["status"]] += 1
    result.data.update({
        "loss_value": loss_value,
        "thresholds": {"vanishing_ratio": opts.vanishing, "exploding_norm": opts.exploding,
                       "exploding_ratio": opts.exploding_ratio, "dead_fraction": opts.dead,
                       "saturated_fraction": opts.saturated, "saturation_margin": opts.saturation_margin},
        "allow": list(opts.allow), "strict": opts.strict,
        "status_counts": dict(counts),
    })
    for r in rows:
        r["_shape"] = "x".join(str(d) for d in r["shape"]) or "scalar"
        r["_status"] = r["status"] + (" (allowed)" if r["allowed"] else "")
        r["_style"] = _style(r["status"], r["allowed"])
        r.pop("why", None)
    for r in layer_rows:
        r["_style"] = "dim" if not r["ran"] else _style(r["status"], False)
    result.tables.append(Table("layers", "Gradient flow by layer (execution order)", [
        Column("_label", "layer"), Column("type", "type"), Column("params", "params", "count"),
        Column("grad_norm", "grad norm", "float"), Column("mean_abs_grad", "mean |grad|", "float"),
        Column("max_abs_grad", "max |grad|", "float"), Column("_bar", "mean |grad| (log)", "bar"),
        Column("status", "status")], layer_rows,
        note=f"depth ≤ {opts.depth}; bar: mean |grad| on a log scale from {10 ** lo:.1e} to {10 ** hi:.1e}; "
             "dim rows never ran in forward"))
    ptable = Table("params", "Parameters", [
        Column("name", "parameter"), Column("_shape", "shape"), Column("grad_norm", "grad norm", "float"),
        Column("weight_norm", "weight norm", "float"), Column("grad_weight_ratio", "grad/weight", "float"),
        Column("mean_abs_grad", "mean |grad|", "float"), Column("max_abs_grad", "max |grad|", "float"),
        Column("_status", "status")], rows)
    if len(rows) > 40:
        ptable.show = False
        result.notes.append(f"{len(rows)} parameters: the per-parameter table is in --json (key 'params'); "
                            "flagged ones are listed below")
    result.tables.append(ptable)
    result.tables.append(Table("activations", "Activation health (module outputs, this batch)", [
        Column("_label", "module"), Column("type", "type"), Column("shape", "output"),
        Column("mean", "mean", "float"), Column("std", "std", "float"),
        Column("zero_fraction", "zeros", "pct"), Column("dead_fraction", "dead units", "pct"),
        Column("saturated_fraction", "saturated", "pct")], act_rows,
        note="dead unit: an output position that is exactly 0 for every sample of the batch; "
             f"saturated: tanh |y| > {1 - opts.saturation_margin:g}, sigmoid outside "
             f"[{opts.saturation_margin:g}, {1 - opts.saturation_margin:g}], hardtanh at its bounds"))

    if opts.histograms:
        for n in names:
            p, g = params[n], grads[n]
            w = p.detach().float().flatten()
            result.histograms[f"gradflow/weight/{n}"] = w[torch.isfinite(w)].cpu().numpy()
            if g is not None:
                gf = (g.coalesce()._values() if g.is_sparse else g).detach().float().flatten()
                result.histograms[f"gradflow/grad/{n}"] = gf[torch.isfinite(gf)].cpu().numpy()

    errors = [f for f in result.findings if f.severity == "error"]
    warnings = [f for f in result.findings if f.severity == "warning"]
    trainable = sum(1 for r in rows if r["requires_grad"])
    reached = sum(1 for r in rows if r["status"] in ("ok", "vanishing-grad", "exploding-grad", "zero-grad",
                                                       "non-finite-grad") and r["requires_grad"])
    result.summary += [
        ("Loss", f"{loss_value:.6g} ({result.header['loss']})"),
        ("Trainable parameters reached", f"{reached} of {trainable} tensors"),
        ("Status", ", ".join(f"{k} {counts[k]}" for k in STATUS_ORDER if counts.get(k))),
    ]
    if opts.strict:
        result.failed = bool(errors or warnings)
    if errors or (opts.strict and warnings):
        bad = errors + (warnings if opts.strict else [])
        result.verdict = f"FAIL: {len(bad)} problem(s): " + ", ".join(sorted({f.code for f in bad}))
    elif warnings:
        result.verdict = (f"PASS with {len(warnings)} warning(s): " + ", ".join(sorted({f.code for f in warnings}))
                          + " (--strict makes warnings fail)")
    else:
        result.verdict = "PASS: gradients reach every trainable parameter with healthy magnitudes"
    return result


def _status(row, opts: Options) -> str:
    if row["nan"] or row["inf"]:
        return "non-finite-grad"
    if row["max_abs_grad"] == 0:
        return "zero-grad"
    ratio = row["grad_weight_ratio"]
    if row["grad_norm"] > opts.exploding or (ratio is not None and ratio > opts.exploding_ratio):
        return "exploding-grad"
    if (ratio if ratio is not None else row["grad_norm"]) < opts.vanishing:
        return "vanishing-grad"
    return "ok"


def _why(name, rec: _Recorder, reach: set[int], ran: set[str], modules) -> tuple[str, str]:
    """('unused' | 'detached', explanation) for a trainable parameter that got no gradient."""
    owner = _owner(name)
    kind = rec.types.get(owner) or type(modules[owner]).__name__
    if owner not in ran:
        # the highest ancestor that never ran either (an unused submodule, not just its leaf)
        top = owner
        for a in _ancestors(owner)[1:]:
            if a in ran or a == "":
                break
            top = a
        top_kind = type(modules[top]).__name__
        return "unused", f"module {_label(top)} ({top_kind}) never ran in forward"
    # the highest ancestor that ran and none of whose outputs reached the loss
    cut = None
    for a in _ancestors(owner):
        if a not in ran:
            continue          # containers (ModuleList) are never called themselves
        nodes = rec.nodes.get(a, [])
        if any(n is not None and id(n) in reach for n in nodes):
            break
        cut = a
    if cut is not None:
        nodes = rec.nodes.get(cut, [])
        ckind = rec.types.get(cut, "")
        if not nodes:
            return "detached", (f"module {_label(cut)} ({ckind}) ran but returned no floating-point tensor "
                                "(argmax, a cast to int, a comparison): no gradient flows through an integer output")
        if all(n is None for n in nodes):
            if not rec.grad_enabled.get(cut, True):
                return "detached", f"module {_label(cut)} ({ckind}) ran under torch.no_grad()"
            return "detached", (f"module {_label(cut)} ({ckind}) ran but its output carried no autograd graph "
                                "(detached or computed under no_grad inside its forward)")
        return "detached", (f"module {_label(cut)} ({ckind}) ran but its output never reached the loss "
                            "(.detach(), a cast to int, or a non-differentiable op after it)")
    return "unused", (f"module {_label(owner)} ({kind}) ran and reached the loss, but this parameter "
                      "was not used (or was detached) in its forward")


def _groups(rows, model, key) -> list[tuple[str, list[dict]]]:
    """Group flagged parameters under the highest module all of whose parameters share `key`."""
    keyed = {r["name"]: key(r) for r in rows}
    module_names = {n: [pn for pn, _ in m.named_parameters(prefix=n)] for n, m in model.named_modules()}
    used: set[str] = set()
    out = []
    for r in rows:
        k = keyed[r["name"]]
        if k is None or r["name"] in used:
            continue
        best = None
        for a in _ancestors(_owner(r["name"])):
            members = module_names.get(a, [])
            if members and all(keyed.get(m) == k for m in members):
                best = a
            else:
                break
        if best is None:
            members, where = [r["name"]], r["name"]
        else:
            members, where = module_names[best], best or "(root)"
        used.update(members)
        out.append((where, [next(x for x in rows if x["name"] == m) for m in members]))
    return out


def _names(members) -> str:
    ns = [m["name"] for m in members]
    return ", ".join(ns[:6]) + (f" … (+{len(ns) - 6})" if len(ns) > 6 else "")


def _param_findings(result, rows, model, opts) -> None:
    from ..render.fmt import number

    def key(r):
        if r["status"] == "ok" or r["allowed"]:
            return None
        return (r["status"], r.get("reason"), r.get("why"))

    for where, members in _groups(rows, model, key):
        status = members[0]["status"]
        sev = STATUS_SEVERITY[status]
        n = len(members)
        what = (f"{n} parameter tensor{'s' if n > 1 else ''} ({_names(members)})"
                if n > 1 or where != members[0]["name"] else "the parameter")
        if status == "no-grad":
            reason, why = members[0]["reason"], members[0]["why"]
            msg = f"{what}: requires grad but got none — {reason}: {why}"
            hint = ("remove the module or freeze it; --allow '" + (f"{where}.*" if where != members[0]["name"] else where)
                    + "' accepts it as intentional") if reason == "unused" else \
                   "remove the .detach()/torch.no_grad() if this branch should learn, or freeze it"
        elif status == "frozen":
            total = sum(m["numel"] for m in members)
            msg = f"{what} frozen (requires_grad=False): {total:,} values not trained"
            hint = None
        elif status == "zero-grad":
            msg = f"{what}: gradient is exactly zero everywhere"
            hint = "a zero-derivative op (round, sign, argmax, comparison) or dead units sit between it and the loss"
        elif status == "non-finite-grad":
            nan = sum(m["nan"] for m in members)
            inf = sum(m["inf"] for m in members)
            msg = f"{what}: gradient holds {nan:,} NaN and {inf:,} Inf value(s)"
            hint = "run `torchdiag nancheck` to find the op that first produces them"
        elif status == "exploding-grad":
            worst = max(members, key=lambda m: m["grad_norm"] or 0)
            msg = (f"{what}: grad norm up to {number(worst['grad_norm'])} (grad/weight "
                   f"{number(worst['grad_weight_ratio'])}); thresholds: norm > {opts.exploding:g} or ratio > {opts.exploding_ratio:g}")
            hint = "check initialisation scale, normalisation layers, learning rate; clip gradients"
        else:  # vanishing
            worst = min(members, key=lambda m: (m["grad_weight_ratio"] if m["grad_weight_ratio"] is not None else m["grad_norm"]) or 0)
            r = worst["grad_weight_ratio"] if worst["grad_weight_ratio"] is not None else worst["grad_norm"]
            msg = f"{what}: grad/weight ratio down to {number(r)} (threshold {opts.vanishing:g})"
            hint = "saturating activations, depth without residuals/normalisation, or tiny initialisation"
        result.add(status, sev, where, msg, hint)
    allowed = [r for r in rows if r["allowed"]]
    if allowed:
        result.add("allowed", "info", "", f"{len(allowed)} flagged parameter(s) accepted by --allow: "
                   + ", ".join(f"{r['name']} ({r['status']})" for r in allowed[:8]) + (" …" if len(allowed) > 8 else ""))


def _style(status, allowed):
    if allowed:
        return "dim"
    return {"error": "red", "warning": "yellow"}.get(STATUS_SEVERITY.get(status) or "", None)


def _layer_rows(layers, rows, rec: _Recorder, modules) -> list[dict]:
    out = []
    for path, own_only in layers:
        if own_only:
            members = [r for r in rows if r["module"] == path]
        else:
            members = [r for r in rows if path == "" or r["name"].startswith(path + ".")]
        order = rec.order.get(path)
        if order is None:
            sub = [v for k, v in rec.order.items() if k.startswith(path + ".")]
            order = min(sub) if sub else None
        with_grad = [m for m in members if m["grad_norm"] is not None]
        sq = sum(m["grad_norm"] ** 2 for m in with_grad)
        numel = sum(m["numel"] for m in with_grad)
        status = min((m["status"] for m in members), key=STATUS_ORDER.index) if members else "ok"
        if all(m["status"] == "frozen" for m in members):
            status = "frozen"
        label = _label(path) + (" (own)" if own_only else "")
        out.append({
            "layer": path, "own_only": own_only, "_label": label, "type": type(modules[path]).__name__,
            "params": sum(m["numel"] for m in members), "tensors": len(members),
            "grad_norm": math.sqrt(sq) if with_grad else None,
            "mean_abs_grad": (sum(m["mean_abs_grad"] * m["numel"] for m in with_grad) / numel) if numel else None,
            "max_abs_grad": max((m["max_abs_grad"] for m in with_grad), default=None),
            "weight_norm": math.sqrt(sum(m["weight_norm"] ** 2 for m in members)),
            "status": status, "ran": order is not None, "order": order if order is not None else 10 ** 9,
        })
    out.sort(key=lambda r: r["order"])
    for r in out:
        if r["order"] == 10 ** 9:
            r["order"] = None
    return out


def _activation_rows(rec: _Recorder, modules, opts: Options, result) -> list[dict]:
    import torch

    rows = []
    for name in sorted(rec.acts, key=lambda n: rec.order.get(n, 0)):
        act = rec.acts[name]
        n = sum(act.n)
        sums = torch.stack(act.s).double().cpu().tolist()
        norms = torch.stack(act.ss).double().cpu().tolist()
        mean = sum(sums) / n if n else None
        var = max(sum(x * x for x in norms) / n - mean * mean, 0.0) if n else None
        row = {"module": name, "_label": _label(name), "type": rec.types.get(name, ""), "shape": act.shape,
               "calls": len(act.n), "mean": mean, "std": math.sqrt(var) if var is not None and math.isfinite(var) else var,
               "zero_fraction": None, "dead_fraction": None, "dead_units": None, "units": None,
               "saturated_fraction": None}
        if "relu" in act.kind:
            zeros = int(torch.stack(act.zeros).sum())
            dead = int(torch.stack(act.dead).sum())
            row.update(zero_fraction=zeros / n, dead_units=dead, units=act.units,
                       dead_fraction=dead / act.units if act.units else None)
            if act.units and dead / act.units > opts.dead:
                _act_finding(result, opts, "dead-units", name,
                             f"{dead:,} of {act.units:,} output units ({dead / act.units:.1%}) of {row['type']} are 0 "
                             f"for every sample of the batch (threshold {opts.dead:.0%})",
                             "the layer before it is pushing these units negative: check its bias/initialisation "
                             "and the learning rate; LeakyReLU/GELU do not die")
        if "saturating" in act.kind:
            sat = int(torch.stack(act.sat).sum())
            row["saturated_fraction"] = sat / n if n else None
            if n and sat / n > opts.saturated:
                _act_finding(result, opts, "saturated", name,
                             f"{sat / n:.1%} of the outputs of {row['type']} are saturated, where its gradient is ~0 "
                             f"(threshold {opts.saturated:.0%})",
                             "scale the pre-activations down (normalisation, smaller initialisation)")
        row["_style"] = "yellow" if any(f.where == name and f.code in ("dead-units", "saturated")
                                        for f in result.findings) else None
        rows.append(row)
    return rows


def _act_finding(result, opts, code, where, message, hint):
    allowed = any(fnmatch.fnmatchcase(where, pat) for pat in opts.allow)
    if allowed:
        result.add(code, "info", where, message + " (accepted by --allow)")
    else:
        result.add(code, "warning", where, message, hint)


# --------------------------------------------------------------------------- outputs beyond the result

PLOT_SUFFIXES = (".png", ".svg", ".pdf")   # --plot: what the figure is written as (by the name's suffix)


def check_plot_backend(path=None) -> None:
    """--plot needs matplotlib (the optional `plot` extra) and a directory to write to: usage
    errors, before any work."""
    from pathlib import Path

    if path is not None and not Path(path).parent.exists():
        raise UsageError(f"--plot: directory {Path(path).parent} does not exist")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UsageError("--plot needs matplotlib, which is not installed",
                         hint="pip install 'torchdiag[plot]' (or pip install matplotlib)") from None


def write_plot(result, path) -> str:
    """The classic gradient-flow figure: max and mean |grad| per layer, log scale, execution order."""
    from pathlib import Path

    check_plot_backend()
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    path = Path(path)
    if not path.parent.exists():
        raise UsageError(f"--plot: directory {path.parent} does not exist")
    rows = [r for r in result.table("layers").rows if r["ran"] and r["status"] != "frozen"]
    labels = [r["_label"] for r in rows]
    tiny = 1e-30

    def val(x):
        return x if x is not None and math.isfinite(x) and x > 0 else tiny

    maxes = [val(r["max_abs_grad"]) for r in rows]
    means = [val(r["mean_abs_grad"]) for r in rows]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.35 * len(rows) + 2), 4.5), dpi=100)
    x = list(range(len(rows)))
    ax.bar(x, maxes, alpha=0.35, lw=1, color="c", label="max |grad|")
    ax.bar(x, means, alpha=0.6, lw=1, color="b", label="mean |grad|")
    ax.set_yscale("log")
    finite = [v for v in maxes + means if v > tiny]
    if finite:
        ax.set_ylim(min(finite) / 10, max(finite) * 10)
    bad = [i for i, r in enumerate(rows) if r["status"] not in ("ok",)]
    for i in bad:
        ax.axvspan(i - 0.5, i + 0.5, color="r", alpha=0.12)
    if bad:
        from matplotlib.patches import Patch

        handles, names = ax.get_legend_handles_labels()
        handles.append(Patch(color="r", alpha=0.12))
        names.append("flagged (" + ", ".join(sorted({rows[i]["status"] for i in bad})) + ")")
        ax.legend(handles, names, loc="upper right", fontsize=8)
    else:
        ax.legend(loc="upper right", fontsize=8)
    ax.set_xticks(x)
    ax.set_xticklabels(labels, rotation=90, fontsize=7)
    ax.set_xlim(-0.75, len(rows) - 0.25)
    ax.set_xlabel("layer (execution order)")
    ax.set_ylabel("|gradient|")
    ax.set_title(f"Gradient flow — {result.header.get('model', '')}", fontsize=9)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    try:
        fig.savefig(path)
    except (OSError, ValueError) as exc:
        raise UsageError(f"--plot: cannot write {path}: {one_line(exc)}") from exc
    finally:
        plt.close(fig)
    return str(path)


def write_tb_layers(result, logdir) -> None:
    """Per-layer grad norms as TensorBoard scalars: `gradflow/layer_grad_norm/<layer>` at step 0, and
    `gradflow/grad_norm_by_layer` with the layer's execution index as the step (the flow as a curve)."""
    from ..render.tensorboard import open_writer

    writer, _ = open_writer(logdir, "gradflow")
    try:
        rows = [r for r in result.table("layers").rows if r["grad_norm"] is not None]
        for i, r in enumerate(rows):
            tag = r["layer"] or "root"
            if math.isfinite(r["grad_norm"]):
                writer.add_scalar(f"gradflow/layer_grad_norm/{tag}", r["grad_norm"], 0)
                writer.add_scalar("gradflow/grad_norm_by_layer", r["grad_norm"], i)
                writer.add_scalar(f"gradflow/layer_weight_norm/{tag}", r["weight_norm"], 0)
        writer.flush()
    finally:
        writer.close()
