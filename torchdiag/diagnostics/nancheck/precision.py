"""nancheck under reduced precision (--dtype bfloat16|float16, --amp bf16|fp16).

- `Watch`: during the same flagged pass, per module call the largest |x| of each floating output and of
  the gradient arriving at it, and per parameter its gradient's largest |g| and exact zeros; kept on the
  device and read back with the pass's own flags (no extra host sync).
- The float32 reference (`reference_pass`): a float32 copy (same weights, upcast exactly; same inputs,
  RNG state and loss target) run without autocast. It runs only when the reduced pass found a non-finite
  value (to say why) or a parameter gradient holding exact zeros (underflow can only show as zeros).
- Underflow, per parameter: among the elements whose float32 gradient is nonzero, the fraction below the
  reduced dtype's range (0 when cast to it) and exactly zero in the reduced run; zeros of the reduced run
  whose float32 value the dtype can hold are rounding (a gate flipped at 0), counted apart, not underflow.
  Reported per module (its own parameters)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ...core.precision import HEADROOM, facts, is_reduced
from ...core.readback import read_back
from .finite import flatten
from .flags import FlagChecker

UNDERFLOW_WARN = 0.01     # a module whose parameter gradients lost ≥ 1% of their nonzero values to underflow


class WatchChecker(FlagChecker):
    """The flagged pass's checker, also feeding every module output to a Watch."""

    def __init__(self, model, watch: Watch):
        super().__init__(model)
        self.watch = watch

    def _post(self, mod, args, output):
        super()._post(mod, args, output)
        self.watch.record(self.names.get(id(mod), "?"), type(mod).__name__, output)


@dataclass
class Watch:
    rows: list = field(default_factory=list)        # {call, module, type, kind: output|gradient, dtype, max_abs}
    params: list = field(default_factory=list)      # {parameter, module, dtype, max_abs, zeros, numel}
    grads: dict = field(default_factory=dict)       # parameter name -> its gradient (for the underflow compare)
    _scalars: list = field(default_factory=list)
    _handles: list = field(default_factory=list)
    _last: tuple | None = None      # (tensor, version) recorded last: a parent returning it is not a new value
    _calls: int = 0

    def checker(self, model):
        return WatchChecker(model, self)

    def record(self, name: str, type_name: str, output) -> None:
        self._calls += 1
        for _, t in flatten(output, "output", []):
            last = self._last
            if not t.is_floating_point() or not t.numel() or (last and last[0] is t and last[1] == t._version):
                continue      # a parent returning its child's tensor is recorded once, at the child
            self._last = (t, t._version)
            base = {"call": self._calls, "module": name or "(root)", "type": type_name, "dtype": str(t.dtype)}
            self.rows.append(dict(base, kind="output"))
            self._scalars.append(t.detach().abs().amax())
            if t.requires_grad:
                self.rows.append(dict(base, kind="gradient"))
                self._scalars.append(None)   # filled by the hook when backward reaches it
                self._handles.append(t.register_hook(self._grad_hook(len(self._scalars) - 1)))

    def _grad_hook(self, slot: int):
        def hook(grad):
            if grad is not None and self._scalars[slot] is None:
                self._scalars[slot] = grad.detach().abs().amax()
        return hook

    def remove_hooks(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self._last = None

    def scalars(self, model) -> list:
        """The device values to read back with the pass's flags: module magnitudes, then per parameter
        gradient (largest |g|, exact zeros). Keeps a reference to each gradient for the compare."""
        import torch

        self.rows = [r for r, s in zip(self.rows, self._scalars) if s is not None]
        out = [s for s in self._scalars if s is not None]
        for name, p in model.named_parameters():
            if p.grad is None or not p.grad.numel():
                continue
            g = p.grad.detach()
            self.grads[name] = g
            self.params.append({"parameter": name, "module": name.rsplit(".", 1)[0] if "." in name else "(root)",
                                "dtype": str(g.dtype), "numel": g.numel()})
            out += [g.abs().amax(), (g == 0).sum()]
        self._scalars = []
        return [torch.as_tensor(s) for s in out]

    def take(self, values: list) -> None:
        n = len(self.rows)
        for r, v in zip(self.rows, values[:n]):
            r["max_abs"] = v
        for i, p in enumerate(self.params):
            p["max_abs"], p["zeros"] = values[n + 2 * i], int(values[n + 2 * i + 1])

    @property
    def has_zero_grads(self) -> bool:
        return any(p["zeros"] for p in self.params)


def headroom_rows(watch: Watch) -> list:
    """Reduced-precision values (outputs, their gradients, parameter gradients) finite but within HEADROOM
    of their dtype's largest finite value."""
    import math

    rows = []
    for r in watch.rows + [dict(p, kind="parameter gradient", type="") for p in watch.params]:
        if not is_reduced(r["dtype"]) or not math.isfinite(r["max_abs"]):
            continue
        f = facts(r["dtype"])
        if r["max_abs"] > f.headroom_limit:
            rows.append({"module": r.get("parameter") or r["module"], "type": r["type"], "kind": r["kind"],
                         "dtype": f.name, "max_abs": r["max_abs"], "largest_finite": f.max,
                         "margin": f.max / r["max_abs"]})
    return rows


def reference_pass(model, inputs, loss_fn, ctx, state):
    """The float32 reference: a float32 train copy from the same RNG state and loss target, no autocast.
    (work, PassReport, Watch); the caller's RNG stream is left where it was."""
    import torch

    from ...core.guard import restore_buffers, snapshot_buffers
    from ...core.precision import cast_inputs
    from ...core.train import train_copy
    from .flags import localized_pass, set_rng_state

    with torch.random.fork_rng(devices=[ctx.device] if ctx.on_cuda else []), torch.enable_grad():
        # a plain copy, never wrapped under torchrun: the reference is a local comparison, no collectives
        work = train_copy(model, "to run the float32 reference", torch.float32, backward=True,
                          activations=ctx.activation_bytes(torch.float32)).to(torch.float32)
        x = cast_inputs(inputs, "float32") if ctx.spec.dtype else inputs
        set_rng_state(state, ctx.device)
        saved = snapshot_buffers(work)
        watch = Watch()
        rep = localized_pass(work, x, loss_fn, reset=lambda: restore_buffers(saved), device=ctx.device, watch=watch)
    return work, rep, watch


def inner_max(work, inputs, module: str, ctx, state, above: float | None = None) -> tuple[str, float] | None:
    """(op, largest |x|) over the floating outputs of the ops that run inside `module`'s forward (its
    own code and its submodules) in one more forward of the float32 reference copy `work` (same inputs and
    RNG state, no grad): the intermediate a module output does not show (q @ k^T before a softmax).
    Only on a forward failure whose module output is in range in float32. None when nothing ran."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    from ...core.precision import cast_inputs

    seen, depth = [], [0]

    class Inner(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if depth[0]:
                seen.extend((str(func.overloadpacket.__name__), t.detach().abs().amax()) for t in tree_leaves(out)
                            if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel())
            return out

    x = cast_inputs(inputs, "float32") if ctx.spec.dtype else inputs
    if not _inside(work, x, module, ctx, state, Inner(), depth) or not seen:
        return None
    values = read_back([v for _, v in seen])
    i = max(range(len(values)), key=lambda k: values[k] if math.isfinite(values[k]) else -1.0)
    if above is not None:   # the first op past the dtype's range, in running order: exp before the sum of its outputs
        i = next((k for k, v in enumerate(values) if v > above), i)
    return seen[i][0], values[i]


def inner_origin(model, inputs, module: str, ctx, state) -> dict | None:
    """The first op inside `module`'s forward (its own code and its submodules) whose output is non-finite while its
    floating inputs are finite, in one more forward of the reduced-precision model as the pass ran it (same inputs
    and RNG state, no grad): {"op", "detail"}, the detail what its inputs held that made it (a negative under a
    sqrt, a zero divisor). The module's own output said where; this says which op (a sweep: a variance by
    E[x²] − E[x]² that cancels below 0 in float16 was "rounding earlier in the forward"). None when none is found."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves


    found: list = []
    depth = [0]

    class First(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if depth[0] and not found:
                floats = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor) and t.is_floating_point()]
                outs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor) and t.is_floating_point()]
                if outs and not all(bool(torch.isfinite(t).all()) for t in outs) \
                        and all(bool(torch.isfinite(t).all()) for t in floats):
                    found.append((str(func.overloadpacket.__name__), floats))
            return out

    with ctx.autocast():
        ran = _inside(model, inputs, module, ctx, state, First(), depth)
    if not ran or not found:
        return None
    op, floats = found[0]
    return {"op": op, "detail": _op_detail(op, floats)}


def _inside(model, inputs, module: str, ctx, state, mode, depth: list) -> bool:
    """One more forward of `model` (no grad, the pass's RNG state) under the dispatch `mode`, with depth[0] > 0 while
    `module` runs. False when there is no such module or the forward raised (it ran once already: not news)."""
    import torch

    from .flags import set_rng_state

    target = dict(model.named_modules()).get("" if module == "(root)" else module)
    if target is None:
        return False
    handles = [target.register_forward_pre_hook(lambda *_: depth.__setitem__(0, depth[0] + 1)),
               target.register_forward_hook(lambda *_: depth.__setitem__(0, depth[0] - 1))]
    try:
        with torch.random.fork_rng(devices=[ctx.device] if ctx.on_cuda else []), torch.no_grad(), mode:
            set_rng_state(state, ctx.device)
            inputs.call(model)
        return True
    except Exception:
        return False
    finally:
        for h in handles:
            h.remove()


def _op_detail(op: str, floats: list) -> str:
    """What the finite inputs of the op that made the first non-finite value held, where the op says what to look
    at: a root or log of values ≤ 0, a division by 0."""
    if not floats:
        return ""
    x = floats[0].detach().float()
    if op in ("sqrt", "rsqrt", "log", "log2", "log10", "pow") and bool((x < 0).any()):
        return f"its input reaches {float(x.min()):.3g}, below 0"
    if op in ("sqrt", "rsqrt", "log", "log2", "log10", "reciprocal") and bool((x == 0).any()):
        return "its input holds exact zeros"
    if op == "div" and len(floats) > 1 and bool((floats[1] == 0).any()):
        return "its divisor holds exact zeros"
    return ""


def underflow_rows(reduced: dict, work, dtype: str) -> list:
    """Per module, of its parameter-gradient values nonzero in float32 (the reference): how many are below
    `dtype`'s range (cast to it they are 0: at most half its smallest subnormal) and exactly 0 in the reduced
    run (underflow); how many `dtype` holds only as subnormals (nonzero, below its smallest normal: precision
    lost); and how many are 0 in the reduced run at all (underflow, or rounding earlier in the step: a
    ReLU-like gate flipped at 0, a sum cancelled). Computed on the device, read back once."""
    import torch

    tiny = facts(dtype).smallest_normal
    low = getattr(torch, dtype)
    names, scalars = [], []
    for name, p in work.named_parameters():
        g32, gr = p.grad, reduced.get(name)
        if g32 is None or gr is None or g32.shape != gr.shape:
            continue
        g32 = g32.detach()
        nonzero, zero_reduced = g32 != 0, gr.to(g32.device) == 0
        cast = g32.to(low)
        below = nonzero & (cast == 0)
        names.append(name)
        scalars += [nonzero.sum(), (below & zero_reduced).sum(), (nonzero & (cast != 0) & (cast.abs() < tiny)).sum(),
                    (nonzero & zero_reduced).sum()]
    values = read_back([torch.as_tensor(s) for s in scalars])
    by_module: dict = {}
    keys = ("nonzero_float32", "underflow", "subnormal", "zero_reduced")
    for i, name in enumerate(names):
        module = name.rsplit(".", 1)[0] if "." in name else "(root)"
        row = by_module.setdefault(module, {"module": module, "parameters": [], **dict.fromkeys(keys, 0)})
        row["parameters"].append(name.rsplit(".", 1)[-1])
        for k, key in enumerate(keys):
            row[key] += int(values[4 * i + k])
    rows = [r for r in by_module.values() if r["zero_reduced"] or r["subnormal"]]
    for r in rows:
        r["fraction"] = r["underflow"] / r["nonzero_float32"]
    return sorted(rows, key=lambda r: (-r["fraction"], -r["zero_reduced"], r["module"]))


def call_max(watch: Watch, module: str, occurrence: int, kind: str) -> float | None:
    """The largest |x| (kind output) or |grad| (kind gradient) of the `occurrence`-th call of `module`."""
    calls = sorted({r["call"] for r in watch.rows if r["module"] == module})
    if occurrence >= len(calls):
        return None
    values = [r["max_abs"] for r in watch.rows if r["call"] == calls[occurrence] and r["kind"] == kind]
    return max(values) if values else None


__all__ = ["Watch", "WatchChecker", "headroom_rows", "reference_pass", "inner_max", "underflow_rows", "call_max", "HEADROOM",
           "UNDERFLOW_WARN"]
