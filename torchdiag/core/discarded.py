"""What became of a module's output that never reached the loss, found by following it through one forward:
- `discarded`: it, and all computed from it, was thrown away (a pooler whose output the task head never reads):
  dead computation, not a cut gradient path;
- `returned`: it reaches the model's output, which the loss does not use;
- `cut`: an op used it without carrying a gradient on (`.detach()`, `torch.no_grad()`, a cast to int, a
  comparison, `.item()`).

One extra forward with grad enabled on the model in place (left as it was), under a TorchFunctionMode that
sees each top-level op once; run only when gradflow, doctor or overfit-batch have a module to explain."""
from __future__ import annotations

from typing import Any

# ops that read a tensor's values into Python: a use that carries no gradient
_READS = {"item", "tolist", "numpy", "__bool__", "__float__", "__int__", "__index__", "__array__"}


def _mode_base():
    from torch.overrides import TorchFunctionMode

    return TorchFunctionMode


class _Follow(_mode_base()):  # type: ignore[misc]
    """Every tensor derived (with a gradient path) from a watched module's output, and the watched modules an op
    used without passing a gradient path on."""

    def __init__(self):
        super().__init__()
        self.derived: dict[int, tuple[Any, frozenset]] = {}   # id → (tensor, kept alive so ids stay unique; sources)
        self.cut: set[str] = set()

    def watch(self, name: str, tensors) -> None:
        for t in tensors:
            if t.requires_grad:
                old = self.derived.get(id(t), (t, frozenset()))[1]
                self.derived[id(t)] = (t, old | {name})

    def sources(self, obj) -> frozenset:
        import torch
        from torch.utils._pytree import tree_flatten

        found: frozenset = frozenset()
        for x in tree_flatten(obj)[0]:
            if isinstance(x, torch.Tensor) and id(x) in self.derived:
                found |= self.derived[id(x)][1]
        return found

    def __torch_function__(self, func, types, args=(), kwargs=None):
        import torch
        from torch.utils._pytree import tree_flatten

        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if not self.derived:
            return out
        src = self.sources((args, kwargs))
        if not src:
            return out
        results = [x for x in tree_flatten(out)[0] if isinstance(x, torch.Tensor)]
        carried = [t for t in results if t.requires_grad]
        for t in carried:
            self.watch_many(t, src)
        if not carried and (results or getattr(func, "__name__", "") in _READS):
            self.cut |= src
        return out

    def watch_many(self, t, src: frozenset) -> None:
        old = self.derived.get(id(t), (t, frozenset()))[1]
        self.derived[id(t)] = (t, old | src)


def fates(model, inputs, modules: set[str], ctx=None) -> dict[str, str]:
    """{module: 'discarded' | 'returned' | 'cut'} for each module in `modules` (each ran, and none of its outputs
    reached the loss), from one forward in train mode. {} when the forward raises (the caller keeps its verdict)."""
    import torch

    from .design import stochastic_depth_off
    from .guard import leave_no_trace
    from .recording import float_tensors

    follow = _Follow()
    by_id = {id(m): n for n, m in model.named_modules() if n in modules}
    handles = [m.register_forward_hook(lambda mod, a, out: follow.watch(by_id[id(mod)], float_tensors(out)))
               for n, m in model.named_modules() if n in modules]
    try:
        with leave_no_trace(model, buffers=True):
            model.train()
            stochastic_depth_off(model)
            torch.set_grad_enabled(True)
            autocast = ctx.autocast() if ctx is not None else _nothing()
            with follow, autocast:
                output = inputs.call(model)
            returned = follow.sources(float_tensors(output))
    except Exception:   # the judged pass already ran this forward; a failure here changes nothing it found
        return {}
    finally:
        for h in handles:
            h.remove()
    return {n: "returned" if n in returned else "cut" if n in follow.cut else "discarded" for n in modules}


def _nothing():
    import contextlib

    return contextlib.nullcontext()
