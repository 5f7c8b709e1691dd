"""What became of a module's output that never reached the loss, found by following it through one forward:
- `discarded`: it, or what was computed from it, left the module that holds it through that module's return value
  (an ancestor's output below the model: a base model's pooled output), and its caller threw it away (a task
  head that never reads the pooler): an API output a user of the component ignored, dead computation;
- `dropped`: it, and all computed from it, died inside the forward of a module that holds it, never returned
  (a branch computed and never used: a missing `x = x + attn(x)`, a value kept only on an attribute);
- `left-out`: what was computed from it reaches the model's output, which the loss does not use;
- `cut`: an op used it without carrying its gradient on (`.detach()`, `torch.no_grad()`, a cast to int, a
  comparison, the indices of a sort or top-k, `.item()`, a copy into a buffer).

Followed conservatively: a tensor counts as computed from the output only where its autograd graph leads back to
it (`view_as(p)` takes p's shape, not its values); any other use, except reading its size, dtype or device, is a
cut. One extra forward with grad enabled on the model in place (left as it was, the RNG as the judged pass had
it), under a TorchFunctionMode that sees each top-level op once; run only when gradflow has such a module to
explain (this module is imported then, so torch at its top costs the CLI's start nothing)."""
from __future__ import annotations

import functools
from typing import Any

from torch.overrides import TorchFunctionMode

# ops that read a tensor's values into Python: a use that carries no gradient
_READS = {"item", "tolist", "numpy", "__bool__", "__float__", "__int__", "__index__", "__array__"}
# ops that read only a tensor's metadata: not a use of its values
_METADATA = {"__get__", "size", "dim", "numel", "nelement", "ndimension", "stride", "storage_offset", "data_ptr",
             "element_size", "is_contiguous", "is_floating_point", "is_complex", "get_device", "__len__", "__repr__",
             "__format__", "__hash__", "__sizeof__"}
MAX_WALK = 4096   # autograd nodes walked per result (an op's own nodes: a composite op has a few)


class _Follow(TorchFunctionMode):
    """Every tensor whose gradient path leads back to a watched module's output, and the watched modules an op
    used without passing a gradient path on."""

    def __init__(self):
        super().__init__()
        self.derived: dict[int, tuple[Any, frozenset]] = {}   # id → (tensor, kept alive so ids stay unique; sources)
        self.cut: set[str] = set()
        self.exported: set[str] = set()   # sources whose values an ancestor module returned

    def watch(self, name: str, tensors) -> None:
        for t in tensors:
            if t.requires_grad:
                self._add(t, frozenset({name}))

    def _add(self, t, src: frozenset) -> None:
        old = self.derived.get(id(t), (t, frozenset()))[1]
        self.derived[id(t)] = (t, old | src)

    def sources(self, tensors) -> frozenset:
        found: frozenset = frozenset()
        for x in tensors:
            if id(x) in self.derived:
                found |= self.derived[id(x)][1]
        return found

    def __torch_function__(self, func, types, args=(), kwargs=None):
        import torch
        from torch.utils._pytree import tree_flatten

        kwargs = kwargs or {}
        if not self.derived:
            return func(*args, **kwargs)
        given = [x for x in tree_flatten((args, kwargs))[0] if isinstance(x, torch.Tensor)]
        mine = [x for x in given if id(x) in self.derived]
        if not mine:
            return func(*args, **kwargs)
        # taken before the call: an in-place op gives its input a new node
        targets = {id(x.grad_fn): self.derived[id(x)][1] for x in mine if x.grad_fn is not None}
        leaves = self.sources(x for x in mine if x.grad_fn is None)
        stops = {id(x.grad_fn) for x in given if x.grad_fn is not None}
        out = func(*args, **kwargs)
        results = [x for x in tree_flatten(out)[0] if isinstance(x, torch.Tensor)]
        name = getattr(func, "__name__", "")
        if not results and name in _METADATA and name not in _READS:
            return out
        src = self.sources(mine)
        if not results:          # a read into Python, a copy into a buffer (`__setitem__` returns None)
            self.cut |= src
        for t in results:
            through = leaves | _through(t, targets, stops) if t.requires_grad else frozenset()
            if through:
                self._add(t, through)
            else:
                self.derived.pop(id(t), None)   # an in-place detach_: no longer computed from the output
            self.cut |= src - through        # a result without their gradient: a sort's indices, a cast
        return out


def _through(t, targets: dict, stops: set) -> frozenset:
    """The sources of the targets (autograd nodes of followed inputs) that t's graph reaches within this op: walked
    from t's node, not past the nodes of the op's other inputs."""
    found: frozenset = frozenset()
    stack, seen = [t.grad_fn], set[int]()
    while stack and len(seen) < MAX_WALK:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        if id(node) in targets:
            found |= targets[id(node)]
            continue
        if id(node) in stops and node is not t.grad_fn:
            continue
        stack.extend(n for n, _ in node.next_functions)
    return found


def fates(model, inputs, modules: set[str], ctx, rng=None, train: bool = True) -> dict[str, str]:
    """{module: 'discarded' | 'dropped' | 'left-out' | 'cut'} for each module in `modules` (each ran, and none of
    its outputs reached the loss), from one forward in the judged pass's mode (`train`); `rng`: the CPU RNG state
    the judged pass started from (a forward that draws at random draws the same). {} when the forward raises (the
    caller keeps its verdict)."""
    import torch

    from .design import stochastic_depth_off
    from .guard import leave_no_trace
    from .module_paths import ancestors
    from .recording import float_tensors

    follow = _Follow()
    named = dict(model.named_modules())
    holders = {a: {m for m in modules if a in ancestors(m)[1:]} for m in modules for a in ancestors(m)[1:] if a}

    def watched(mod, args, out, name):
        follow.watch(name, float_tensors(out))

    def returned_by(mod, args, out, name):   # an ancestor below the root returns what was computed from them
        follow.exported |= follow.sources(float_tensors(out)) & holders[name]

    handles = [named[n].register_forward_hook(functools.partial(watched, name=n)) for n in modules]
    handles += [named[a].register_forward_hook(functools.partial(returned_by, name=a)) for a in holders if a in named]
    try:
        with leave_no_trace(model, buffers=True), torch.random.fork_rng(devices=[]):
            if rng is not None:
                torch.random.set_rng_state(rng)
            model.train(train)
            stochastic_depth_off(model)
            torch.set_grad_enabled(True)
            with follow, ctx.autocast():
                output = inputs.call(model)
            returned = follow.sources(float_tensors(output))
    except Exception:   # the judged pass already ran this forward; a failure here changes nothing it found
        return {}
    finally:
        for h in handles:
            h.remove()
    return {n: "left-out" if n in returned else "cut" if n in follow.cut else
            "discarded" if n in follow.exported else "dropped" for n in modules}
