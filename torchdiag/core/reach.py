"""Would the loss have moved, had nothing cancelled the shift? (core/invariance.py's second question.)

A parameter the loss does not depend on is `invariant` only when the shift acts on what the loss reads and
something after it cancels the move (a normalisation, a softmax). Where it acts is its own module's output,
the module run again alone on its first call's arguments; what that move would do to the loss, to first
order, without a cancellation after it, is bounded by sum |dL/d out| × |out moved|. A parameter that moves
nothing (a LayerNorm weight over one feature multiplies zeros) or moves only what nothing reads (the unused
half of a bidirectional LSTM: its gradient there is exactly 0) has a bound of 0 and keeps its verdict; one
whose bound is below what the shift test sees is asked again with a larger shift (invariance.py)."""
from __future__ import annotations

import dataclasses

from . import derived
from .device import widened
from .module_paths import ancestors, owner

SEEN = 10.0   # the bound must be this many times the shift test's threshold on the loss


def _first_of_two() -> bool:
    """A call a reentrant checkpoint makes under no_grad and makes again in backward: the second is the one
    differentiated, the first (no graph) is not counted (a Hugging Face BERT with gradient checkpointing kept its
    softmax-invariant key biases `vanishing-grad`: a review)."""
    import torch

    if torch.is_grad_enabled():
        return False
    from .reentrant import recomputed

    return recomputed()


class FirstCalls:
    """Each wanted module's first call (its arguments, cloned: a forward may change its input in place) and
    the loss's gradient at its floating outputs. Installed around the base forward and backward (`with`)."""

    def __init__(self, work, names: list[str]):
        wanted = {owner(n) for n in names}
        self.modules = {n: m for n, m in work.named_modules() if n in wanted}
        self.args: dict[str, tuple] = {}
        self.grads: dict[str, list] = {}
        self.count: dict[str, int] = {}     # calls of each wanted module and of their ancestors
        # an ancestor's calls are counted: a parameter whose own module never runs acts inside one (derived.py)
        above = {a for w in wanted for a in ancestors(w)[1:]} - wanted
        self.hosts = {n: m for n, m in work.named_modules() if n in above}
        self.work = work
        self.handles: list = []

    def __enter__(self):
        for n, m in self.modules.items():
            self.handles += [m.register_forward_pre_hook(self._keep(n), with_kwargs=True),
                             m.register_forward_hook(self._watch(n))]
        for n, m in self.hosts.items():
            self.handles.append(m.register_forward_pre_hook(self._counted(n)))
        return self

    def __exit__(self, *exc):
        for h in self.handles:
            h.remove()

    def _keep(self, name):
        def hook(_mod, args, kwargs):
            if _first_of_two():
                return
            self.count[name] = self.count.get(name, 0) + 1
            self.args.setdefault(name, _cloned((args, kwargs)))
        return hook

    def _counted(self, name):
        def hook(*_):
            if _first_of_two():
                return
            self.count[name] = self.count.get(name, 0) + 1
        return hook

    def _watch(self, name):
        def hook(_mod, _args, out):
            if name in self.grads or _first_of_two():
                return
            outs = floats(out)
            self.grads[name] = [None] * len(outs)
            for i, t in enumerate(outs):
                if t.requires_grad:
                    t.register_hook(lambda g, i=i: self.grads[name].__setitem__(i, g.detach()))
        return hook

    def once(self, name: str) -> bool:
        """Its module ran exactly once: its first call is its only one."""
        return self.count.get(owner(name)) == 1

    def bound(self, name: str, shifted, ctx, wide, loss=None) -> float | None:
        """How far shifting `name` would move the loss, to first order, through its module's output had nothing
        after it cancelled the move: sum |gradient| × |move| (core/invariance.py compares it with what the shift
        test sees). A module that never ran is measured at the ops its parameter reaches inside the ancestor
        that uses it (derived.py; `loss`: the seeded forward's loss). None when unknown (no module of it ran,
        it fails alone, or its outputs change shape): the parameter keeps its verdict."""
        import torch

        mod, call = self.modules.get(owner(name)), self.args.get(owner(name))
        if mod is not None and call is None:
            at = derived.host(name, self.count)
            if at is None or loss is None:
                return None
            try:
                return derived.bound(self.work, name, at, loss, shifted)
            except Exception:   # noqa: BLE001 - what cannot be measured is not known to act: keep the verdict
                return None
        if mod is None or call is None:
            return None

        def out():
            args, kwargs = _cloned(call)
            with ctx.seeded(), wide():
                return [t.detach().clone() for t in floats(mod(*args, **kwargs))]

        try:
            with torch.no_grad():
                before, after = out(), shifted(out)
        except Exception:   # noqa: BLE001 - what cannot run alone is not known to act: keep the verdict
            return None
        return _first_order(before, after, self.grads.get(owner(name), []))


def _first_order(before: list, after: list, grads: list) -> float | None:
    """sum |gradient| × |move| over the outputs the gradient reached (one read), or None when the outputs
    changed shape."""
    import torch

    if len(before) != len(after) or any(a.shape != b.shape for a, b in zip(before, after)):
        return None
    terms = [first_order(g, b, a) for a, b, g in zip(after, before, grads)
             if g is not None and g.shape == a.shape and a.numel()]
    return float(torch.stack(terms).sum()) if terms else 0.0


def first_order(grad, before, after):
    """sum |grad| × |after − before| (a float64 tensor; float32 on mps): no move where the two agree (a mask's −inf in both, whose
    difference is NaN), and non-finite terms left out (a review: 0 × NaN made the bound NaN, and a NaN bound passed
    for a cancellation)."""

    a, b = widened(after), widened(before)
    # in place on one temporary: a float64 copy of every activation was made ~8 times over (a perf review)
    terms = (a - b).abs_().masked_fill_(a == b, 0).mul_(widened(grad).abs())
    return terms.nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0).sum()


def _cloned(obj):
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, tuple):
        return tuple(_cloned(o) for o in obj)
    if isinstance(obj, list):
        return [_cloned(o) for o in obj]
    if isinstance(obj, dict):
        return {k: _cloned(v) for k, v in obj.items()}
    return obj


def floats(out) -> list:
    import torch

    if isinstance(out, torch.Tensor):
        return [out] if out.is_floating_point() else []
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in floats(o)]
    if isinstance(out, dict):
        return [t for o in out.values() for t in floats(o)]
    if dataclasses.is_dataclass(out) and not isinstance(out, type):
        return [t for f in dataclasses.fields(out) for t in floats(getattr(out, f.name, None))]
    return []
