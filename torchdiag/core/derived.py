"""Where does a parameter act when its own module never runs? (core/reach.py's bound, by op.)

Some models keep weights in a module they never call and hand them to a function of the parent: WavLM's
attention passes `k_proj.weight` and `torch.cat((q_proj.bias, k_proj.bias, v_proj.bias))` to
`F.multi_head_attention_forward`. There is no module output to measure there, so the bound is taken at the
ops: inside the nearest ancestor that runs, every tensor an op makes from the parameter (or from such a tensor)
is kept, in order, with the loss's gradient at it. The same forward with the parameter shifted gives each
tensor's move, and the bound is the largest sum |gradient| × |move| over them: the first-order move of the loss
at the cut nearest the parameter that nothing after it cancelled (the keys, for a key bias; a softmax's output
does not move). Ops are seen at the dispatcher (a TorchDispatchMode), below the functions that group them."""
from __future__ import annotations

import functools

from .module_paths import ancestors, owner

MAX_KEPT = 64    # tensors kept per forward at most: the cuts nearest the parameter come first


def host(name: str, count: dict[str, int]) -> str | None:
    """The nearest ancestor of `name`'s module that ran (count: calls per module path), or None."""
    return next((a for a in ancestors(owner(name))[1:] if count.get(a)), None)


def bound(work, name: str, at: str, loss, shifted) -> float | None:
    """The largest first-order loss move over the tensors `name` reaches inside the first call of module `at`
    (see the module's doc); `loss` runs the seeded forward and returns the loss, `shifted(measure)` runs
    measure with the parameter shifted. None when the two forwards keep different tensors."""
    import torch

    from .reach import first_order

    param, mod = dict(work.named_parameters())[name], dict(work.named_modules())[at]
    with torch.enable_grad(), _Kept(mod, param) as base:
        value = loss()
        live = [t for t in base.tensors if t.requires_grad]
        grads = dict(zip(map(id, live), torch.autograd.grad(value, live, allow_unused=True))) if live else {}

    def measure():   # with grad as the base forward: some ops differ without it (a detach, another kernel)
        with torch.enable_grad(), _Kept(mod, param) as moved:
            loss()
        return [t.detach() for t in moved.tensors]

    after = shifted(measure)
    if len(after) != len(base.tensors) or any(a.shape != b.shape for a, b in zip(after, base.tensors)):
        return None
    terms = [first_order(g, b.detach(), a)
             for a, b in zip(after, base.tensors) if (g := grads.get(id(b))) is not None and g.shape == b.shape]
    return float(torch.stack(terms).max()) if terms else 0.0


class _Kept:
    """Around one forward: during `mod`'s first call, the floating tensors ops make from `param` or from
    what they made before, in order (`tensors`)."""

    def __init__(self, mod, param):
        self.mod, self.param, self.tensors, self.calls, self.handles = mod, param, [], 0, []
        self.mode = None

    def __enter__(self):
        self.handles = [self.mod.register_forward_pre_hook(self._begin), self.mod.register_forward_hook(self._end)]
        return self

    def __exit__(self, *exc):
        self._end()   # a forward that raised inside the module leaves the mode on
        for h in self.handles:
            h.remove()

    def _begin(self, *_):
        self.calls += 1
        if self.calls == 1:
            self.mode = _reach_mode()(self.param, self.tensors)
            self.mode.__enter__()

    def _end(self, *_):
        if self.mode is not None:
            mode, self.mode = self.mode, None
            mode.__exit__(None, None, None)


@functools.cache
def _reach_mode():
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten
    from torch.utils.weak import WeakIdKeyDictionary

    class Reach(TorchDispatchMode):
        def __init__(self, param, kept: list):
            super().__init__()
            # what ops made from the parameter, held weakly (a dead tensor's id may be reused; it leaves the set)
            self.made, self.kept = WeakIdKeyDictionary({param: True}), kept

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if len(self.kept) < MAX_KEPT and any(isinstance(a, torch.Tensor) and a in self.made
                                                 for a in tree_flatten((args, kwargs))[0]):
                for t in tree_flatten(out)[0]:
                    if isinstance(t, torch.Tensor) and t.is_floating_point() and len(self.kept) < MAX_KEPT:
                        self.made[t] = True
                        self.kept.append(t)
            return out

    return Reach

