"""Does shifting a parameter act on what the loss reads? (core/invariance.py's second question.)

A parameter the loss does not depend on is `invariant` only when the shift moves something the loss's
gradient reaches, and something after it cancels the move (a normalisation, a softmax). One that moves
nothing (a LayerNorm weight over one feature multiplies zeros) or moves only what nothing reads (the unused
half of a bidirectional LSTM) keeps its verdict. Where it acts is its own module's output, the module run
again alone on its first call's arguments; for a parameter whose module is never called (WavLM passes
`k_proj.bias` to `F.multi_head_attention_forward` through a `torch.cat`), it is the output of the first torch
function that takes it, run again alone the same way."""
from __future__ import annotations

import dataclasses

from .module_paths import owner

MOVE_RTOL = 1e-9   # an output element moved by more than this × the output's largest value


class FirstCalls:
    """Each wanted module's first call and each wanted parameter's first torch function, with the loss's
    gradient at their floating outputs. Installed around the base forward and backward (`with`)."""

    def __init__(self, work, names: list[str]):
        from torch.overrides import TorchFunctionMode

        params = dict(work.named_parameters())
        wanted = {owner(n) for n in names}
        self.modules = {n: m for n, m in work.named_modules() if n in wanted}
        self.args: dict[str, tuple] = {}       # module or parameter name -> (function, args, kwargs)
        self.grads: dict[str, list] = {}
        self.handles: list = []
        ids = {id(params[n]): n for n in names if n in params}
        calls = self

        class FirstOps(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                out = func(*args, **kwargs)
                if not floats(out):   # .shape, .dim(), .dtype: not where the parameter acts
                    return out
                for n in {ids[id(t)] for t in _tensors((args, kwargs)) if id(t) in ids}:
                    if ("op", n) not in calls.args:
                        calls.args["op", n] = (func, _cloned((args, kwargs)))
                        calls._watch(("op", n))(None, None, out)
                return out

        self.ops = FirstOps()

    def __enter__(self):
        for n, m in self.modules.items():
            self.handles += [m.register_forward_pre_hook(self._keep(n), with_kwargs=True),
                             m.register_forward_hook(self._watch(n))]
        self.ops.__enter__()
        return self

    def __exit__(self, *exc):
        self.ops.__exit__(*exc)
        for h in self.handles:
            h.remove()

    def _keep(self, name):
        def hook(mod, args, kwargs):
            self.args.setdefault(name, (mod, _cloned((args, kwargs))))
        return hook

    def _watch(self, name):
        def hook(_mod, _args, out):
            if name in self.grads:
                return
            outs = floats(out)
            self.grads[name] = [None] * len(outs)
            for i, t in enumerate(outs):
                if t.requires_grad:
                    t.register_hook(lambda g, i=i: self.grads[name].__setitem__(i, g.detach()))
        return hook

    def reached(self, name: str, shifted, ctx, wide) -> bool:
        """Does shifting `name` move its module's output (or, its module never called, its first function's)
        where the loss's gradient is not zero? Unknown (neither recorded; it fails alone; its outputs change
        shape) counts as not reached: the parameter keeps its verdict."""
        import torch

        key = owner(name) if owner(name) in self.args else ("op", name)
        if key not in self.args:
            return False
        fn, call = self.args[key]

        def out():
            args, kwargs = _cloned(call)
            with ctx.seeded(), wide():
                return [t.detach().clone() for t in floats(fn(*args, **kwargs))]

        try:
            with torch.no_grad():
                before, after = out(), shifted(out)
        except Exception:   # noqa: BLE001 - what cannot run alone is not known to act: keep the verdict
            return False
        return _moves_where_read(before, after, self.grads.get(key, []))


def _moves_where_read(before: list, after: list, grads: list) -> bool:
    import torch

    if len(before) != len(after) or any(a.shape != b.shape for a, b in zip(before, after)):
        return False
    hits = []
    for i, (a, b) in enumerate(zip(before, after)):
        g = grads[i] if i < len(grads) else None
        if a.numel() == 0 or g is None or g.shape != a.shape:
            continue
        move = (a - b).abs() > MOVE_RTOL * a.abs().max().clamp(min=1e-3)
        hits.append((move & (g != 0)).any())
    return bool(torch.stack(hits).any()) if hits else False   # one read


def _tensors(obj) -> list:
    import torch

    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (tuple, list)):
        return [t for o in obj for t in _tensors(o)]
    if isinstance(obj, dict):
        return [t for o in obj.values() for t in _tensors(o)]
    return []


def _cloned(obj):
    """A copy of a call's arguments (a forward may change its input in place); parameters are kept as they
    are, so a shift applied to them reaches the call run again."""
    import torch

    if isinstance(obj, torch.nn.Parameter):
        return obj
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
