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
from typing import Any

from .module_paths import ancestors, owner

MAX_KEPT = 64    # tensors kept per forward at most: the cuts nearest the parameter come first
SHARE = 4        # the kept tensors take at most 1/SHARE of the memory free: their gradients and a shifted forward's
                 # copies take as much again each


def host(name: str, count: dict[str, int]) -> str | None:
    """The nearest ancestor of `name`'s module that ran (count: calls per module path), or None."""
    return next((a for a in ancestors(owner(name))[1:] if count.get(a)), None)


def bound(work, name: str, at: str, loss, shifted, traced: dict | None = None) -> float | None:
    """The largest first-order loss move over the tensors `name` reaches inside the first call of module `at`
    (see the module's doc); `loss` runs the seeded forward and returns the loss, `shifted(measure)` runs
    measure with the parameter shifted. None when the two forwards keep different tensors. `traced`: what
    `silent`'s pass kept (its `keep`): a name found there costs one shifted forward, not a traced forward and a
    backward more (SAM's 1e-10-initialised tower: 16 names, 71 of doctor's 176 s)."""
    import torch

    params, hosts, mods = {name: dict(work.named_parameters())[name]}, {name: at}, dict(work.named_modules())
    budget = _budget(params)
    if traced and name in traced:
        tensors, grads = traced[name]
    else:
        kept, grads = _traced(params, hosts, mods, loss, budget)
        if name in kept.cut:   # more than the memory lets it keep: not measured
            return None
        tensors = kept.tensors[name]
    terms = _terms(tensors, shifted(_measure(params, hosts, mods, loss, [name], budget))[name], grads)
    if terms is None:
        return None
    return float(torch.stack(terms).max()) if terms else 0.0


def silent(work, names: list[str], count: dict[str, int], loss, shifted=None, keep: dict | None = None) -> set[str]:
    """Of `names`, those whose bound (`bound`) is 0 whatever the shift, found together: the tensors each reaches
    inside its host's first call all get a zero or no gradient from the loss (one forward and one backward for all:
    timm's gMLP zero-initialises its head, so 304 of its 306 tensors get an exactly-zero gradient, and `bound`'s
    passes per name took 553 of gradflow's 575 s); or, with `shifted(group, measure)` (the names left shifted at
    once, one more forward), none of those with a gradient moves (LeViT's residual branches end in a BatchNorm
    whose weight starts at 0: its output has a gradient and does not move). Independent random shifts do not
    cancel one another exactly, as core/invariance.py's group shifts assume too; a tensor another name's shift
    moves leaves that name to `bound`. The names whose tensors the memory cut short are traced again, together,
    while that leaves fewer cut (a perf review: 75 names cut on a busy host went to `bound` one by one, two float64
    forwards each, 350 of a swinv2's 476 s). `keep`, when given, gets each name not found silent and not cut:
    (the tensors it reaches, the loss's gradients at them), for `bound`."""
    params, mods = dict(work.named_parameters()), dict(work.named_modules())
    hosts = {n: h for n in names if n in params and (h := host(n, count)) is not None}
    found: set[str] = set()
    todo = list(hosts)
    while todo:
        quiet, cut = _silent_among(todo, params, hosts, mods, loss, shifted, keep)
        found |= quiet
        todo = [n for n in todo if n in cut] if len(cut) < len(todo) else []
    return found


def _silent_among(names: list[str], params: dict, hosts: dict, mods: dict, loss, shifted,
                  keep: dict | None = None) -> tuple[set, set]:
    """silent's pass over `names`: (the names found silent, the names the memory cut short); see silent's `keep`."""
    import torch

    from .readback import read_back

    watched, hosts = {n: params[n] for n in names}, {n: hosts[n] for n in names}
    budget = _budget(watched)
    kept, grads = _traced(watched, hosts, mods, loss, budget)
    flags = read_back([g.ne(0).any() for g in grads.values()])   # one read
    moving = {i for i, f in zip(grads, flags) if f}
    # a name whose tensors the memory cut short is not known quiet
    quiet = {n for n in hosts if n not in kept.cut and not any(id(t) in moving for t in kept.tensors[n])}
    rest = [n for n in hosts if n not in quiet and n not in kept.cut]
    if keep is not None:   # the gradients at their tensors only: the silent names' are not held on
        held = {id(t) for n in rest for t in kept.tensors[n]}
        at = {k: g for k, g in grads.items() if k in held}
        keep.update((n, (kept.tensors[n], at)) for n in rest)
    if shifted is None or not rest:
        return quiet, set(kept.cut)
    after = shifted(rest, _measure(watched, hosts, mods, loss, rest, budget))
    asked: list[str] = []
    sums: list = []
    seen: dict = {}   # names of one attention share its tensors (3x on a swinv2): each reduced once
    for n in rest:
        terms = _terms(kept.tensors[n], after[n], grads, seen)
        if terms is not None:
            asked.append(n)
            sums.append(torch.stack([t.to(terms[0].device) for t in terms]).sum() if terms else 0.0)
    return quiet | {n for n, v in zip(asked, read_back(sums)) if v == 0}, set(kept.cut)


def _budget(params: dict) -> int | None:
    """The bytes the kept tensors of one forward may take: 1/SHARE of the memory free where the parameters live
    (gradflow's float64 re-check of a ViT-B/16 kept 1.5 GB of them); None where that is not known (mps)."""
    from .resources import device_available

    p = next(iter(params.values()), None)
    free = device_available(p.device) if p is not None else None
    return None if free is None else free // SHARE


def _traced(params: dict, hosts: dict[str, str], mods: dict, loss, budget: int | None = None):
    """One forward keeping what each parameter reaches in its host's first call (_Kept), and the loss's gradient
    at each kept tensor that has one: (kept, {id(tensor): gradient})."""
    import torch

    with torch.enable_grad(), _Kept(params, hosts, mods, budget) as kept:
        value = loss()
        live = list({id(t): t for ts in kept.tensors.values() for t in ts if t.requires_grad}.values())
        grads = torch.autograd.grad(value, live, allow_unused=True) if live else ()
    return kept, {id(t): g for t, g in zip(live, grads) if g is not None}


def _measure(params: dict, hosts: dict[str, str], mods: dict, loss, names: list[str], budget: int | None = None):
    """The forward to run shifted: {name: the tensors it reaches, detached}. With grad as the base forward: some
    ops differ without it (a detach, another kernel). The base forward's budget: the same tensors are kept."""
    def measure():
        import torch

        with torch.enable_grad(), _Kept(params, hosts, mods, budget) as moved:
            loss()
        return {n: [t.detach() for t in moved.tensors[n]] for n in names}

    return measure


def _terms(before: list, after: list, grads: dict, seen: dict | None = None) -> list | None:
    """sum |gradient| x |move| per kept tensor that has a gradient (reach.first_order), or None when the shifted
    forward kept other tensors. `seen`: the terms already made, by (tensor, its shifted value's memory): a tensor
    several names reach is reduced once."""
    from .reach import first_order

    if len(after) != len(before) or any(a.shape != b.shape for a, b in zip(after, before)):
        return None
    seen = {} if seen is None else seen
    out = []
    for a, b in zip(after, before):
        g = grads.get(id(b))
        if g is None or g.shape != b.shape:
            continue
        key = (id(b), a.data_ptr(), a.stride(), a.storage_offset())
        if key not in seen:
            seen[key] = first_order(g, b.detach(), a)
        out.append(seen[key])
    return out


class _Kept:
    """Around one forward: for each name, during its host module's first call (`hosts`: name -> module path), the
    floating tensors ops make from its parameter or from what they made before, in order (`tensors[name]`, at
    most MAX_KEPT; `budget`: the bytes all of them may take, past which a name's list is cut and the name is in
    `cut`). The dispatch mode is on only while a host's first call runs."""

    def __init__(self, params: dict, hosts: dict[str, str], mods: dict, budget: int | None = None):
        self.params, self.hosts, self.mods = params, hosts, mods
        self.budget, self.used = budget, 0
        self.cut: set[str] = set()
        self.tensors: dict[str, list] = {n: [] for n in params}
        self.calls: dict[str, int] = {}
        self.active: set[str] = set()
        self.mode: Any = None
        self.handles: list = []

    def __enter__(self):
        for h in set(self.hosts.values()):
            mod = self.mods[h]
            self.handles += [mod.register_forward_pre_hook(lambda *_, h=h: self._begin(h)),
                             mod.register_forward_hook(lambda *_, h=h: self._end(h))]
        return self

    def __exit__(self, *exc):
        self.active.clear()
        self._end(None)   # a forward that raised inside a host leaves the mode on
        for handle in self.handles:
            handle.remove()

    def _begin(self, h: str) -> None:
        self.calls[h] = self.calls.get(h, 0) + 1
        if self.calls[h] == 1:
            self.active.add(h)
            if self.mode is None:
                mode = _reach_mode()(self)
                mode.__enter__()
                self.mode = mode

    def _end(self, h: str | None) -> None:
        self.active.discard(h)
        if self.mode is not None and not self.active:
            mode, self.mode = self.mode, None
            mode.__exit__(None, None, None)


@functools.cache
def _reach_mode():
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten
    from torch.utils.weak import WeakIdKeyDictionary

    class Reach(TorchDispatchMode):
        def __init__(self, kept: _Kept):
            super().__init__()
            # what ops made from each parameter: tensor -> names, held weakly (a dead tensor's id may be reused)
            self.kept, self.made = kept, WeakIdKeyDictionary()
            for n, p in kept.params.items():
                self.made.setdefault(p, set()).add(n)

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            kept = self.kept
            names = {n for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor) and a in self.made
                     for n in self.made[a]
                     if kept.hosts[n] in kept.active and len(kept.tensors[n]) < MAX_KEPT}
            for t in tree_flatten(out)[0] if names else ():
                if isinstance(t, torch.Tensor) and t.is_floating_point():
                    size = t.numel() * t.element_size()
                    if kept.budget is not None and kept.used + size > kept.budget:
                        kept.cut |= names
                        continue
                    kept.used += size
                    for n in names:
                        if len(kept.tensors[n]) < MAX_KEPT:
                            self.made.setdefault(t, set()).add(n)
                            kept.tensors[n].append(t)
            return out

    return Reach
