"""The gradient norm before clipping. A loop that clips (`torch.nn.utils.clip_grad_norm_`) hands the optimizer
gradients of norm at most max_norm, so the norm watch measures at the step is flat at max_norm and no explosion can
show (a review: AdamW at lr 1.0 clipped at 1, the norm 1.0 at every step). clip_grad_norm_ returns the total norm
before clipping: while watching it is wrapped, and each step's returned norms (device tensors, no sync) go to the
read with the losses. A loop that bound the function by name before watching started (`from torch.nn.utils import
clip_grad_norm_` in the Python API) keeps the original: its norms stay the clipped ones.

A step's norm is taken from the calls only when they tell the whole L2 norm of the gradients it applies (a review
broke the first version five ways): calls since the last backward (a step GradScaler skipped leaves its calls behind),
with the L2 norm, the first call over a parameter counting (measured, then clipped, over the same ones: the first is
the one before clipping), covering every parameter of the step's optimizer that has a gradient (a subset clipped:
the watched norm stays); none over an empty list. torch >= 2.6's split of it, `get_total_norm` then
`clip_grads_with_norm_`, is read from the first, and clipping by value (`clip_grad_value_`) has the norm
measured before it (torch.nn.utils.get_total_norm; clip_grad_norm_'s own inner call is
not the wrapped one)."""
from __future__ import annotations

import contextlib
import functools
import sys
import types
import warnings
import weakref

_ORIGINAL = "_torchdiag_original"   # on a wrapper: the function it wraps
_OWNER = "_torchdiag_owner"         # on a wrapper: its ClipNorms, weakly (closed or gone: a pass-through)


class ClipNorms:
    """clip_grad_norm_'s (and get_total_norm's) calls since the last step of the clock (taken) or of another
    optimizer (dropped)."""

    def __init__(self, engine):
        self._engine = weakref.ref(engine)
        self._since: list = []      # (norm tensor, ids of the gradient tensors it read, backward count)
        self._installed: list = []  # (module name, attribute, wrapper)
        self._closed = False
        self.seen = False           # the loop clipped at least once while watched

    def attach(self) -> None:
        import torch.nn.utils as utils
        from torch.nn.utils import clip_grad

        ref = weakref.ref(self)
        original = clip_grad.clip_grad_norm_

        @functools.wraps(original)
        def clip_grad_norm_(parameters, max_norm, norm_type=2.0, *args, **kwargs):
            me = ref()
            if me is None or me._closed:
                return original(parameters, max_norm, norm_type, *args, **kwargs)
            params = [parameters] if _is_tensor(parameters) else list(parameters)
            if not params and isinstance(parameters, types.GeneratorType):   # torch's warning, at the user's line
                warnings.warn("`parameters` is an empty generator, no gradient clipping will occur.", stacklevel=2)
            total = original(params, max_norm, norm_type, *args, **kwargs)
            me._saw(total, [p.grad for p in params if getattr(p, "grad", None) is not None], norm_type)
            return total

        self._install(clip_grad_norm_, original, "clip_grad_norm_", (clip_grad, utils))
        total_norm = getattr(utils, "get_total_norm", None)   # torch >= 2.6: clipping split in two (a review)
        if total_norm is not None:
            @functools.wraps(total_norm)
            def get_total_norm(tensors, norm_type=2.0, *args, **kwargs):
                me = ref()
                if me is None or me._closed:
                    return total_norm(tensors, norm_type, *args, **kwargs)
                grads = [tensors] if _is_tensor(tensors) else list(tensors)
                total = total_norm(grads, norm_type, *args, **kwargs)
                me._saw(total, grads, norm_type)
                return total

            self._install(get_total_norm, total_norm, "get_total_norm", (utils,))

        by_value = clip_grad.clip_grad_value_   # clips each element: the norm before it is measured here (a review:

        @functools.wraps(by_value)               # Lightning's gradient_clip_algorithm="value" hid a 90,000 norm)
        def clip_grad_value_(parameters, clip_value, *args, **kwargs):
            me = ref()
            if me is None or me._closed:
                return by_value(parameters, clip_value, *args, **kwargs)
            params = [parameters] if _is_tensor(parameters) else list(parameters)
            grads = [p.grad for p in params if getattr(p, "grad", None) is not None]
            with contextlib.suppress(Exception):   # grads on several devices: not measured, the watched norm stays
                me._saw(_l2(grads), grads, 2.0)
            return by_value(params, clip_value, *args, **kwargs)

        self._install(clip_grad_value_, by_value, "clip_grad_value_", (clip_grad, utils))

    def _install(self, wrapper, original, attr: str, modules) -> None:
        setattr(wrapper, _ORIGINAL, original)
        setattr(wrapper, _OWNER, weakref.ref(self))
        for module in modules:
            if getattr(module, attr, None) is original:
                setattr(module, attr, wrapper)
                self._installed.append((module.__name__, attr, wrapper))

    def _saw(self, total, grads: list, norm_type) -> None:
        engine = self._engine()
        ids = frozenset(id(g) for g in grads)
        if engine is None or engine.closed or not ids or float(norm_type) != 2.0 or getattr(total, "ndim", None) != 0:
            return
        self._since.append((total.detach(), ids, engine.backwards))
        self.seen = True

    def close(self) -> None:
        """Put each function back where the wrapper is still the one installed, past any wrapper of a watch closed
        before it (watches closed out of order); a wrapper installed over it later unwraps it when it closes."""
        self._closed, self._since = True, []
        for name, attr, wrapper in self._installed:
            module = sys.modules.get(name)
            if module is not None and getattr(module, attr, None) is wrapper:
                setattr(module, attr, _live(getattr(wrapper, _ORIGINAL)))
        self._installed = []

    def take(self, params, backwards: int, keep_others: bool = False) -> list:
        """An optimizer stepped over `params`: the norms before clipping of its gradients, or [] where the calls do
        not tell the whole norm. Calls over none of its gradients are another's (a review: two models clipped apart,
        the clock's norm read as the two together): dropped, or with `keep_others` (a watched optimizer that is not
        the clock) kept for the clock (a review: the clock clipped, another optimizer stepped, then the clock, and the
        clock's norm was lost). A loop that does not clip costs a list check a step."""
        if not self._since:
            return []
        need = {id(p.grad) for p in params if p.grad is not None}
        own = [v for v in self._since if not v[1].isdisjoint(need)]
        self._since = [v for v in self._since if v[1].isdisjoint(need)] if keep_others else []
        kept: list = []
        covered: set[int] = set()
        for total, ids, _ in (v for v in own if v[2] == backwards):
            if ids.isdisjoint(covered):
                kept.append(total)
                covered |= ids
        return kept if kept and need <= covered else []

    def drop(self) -> None:
        """Another optimizer stepped: what was clipped since was its gradients."""
        self._since = []


def _l2(grads: list):
    """The L2 norm of all of them, on their device (no sync): None for none."""
    import torch

    if not grads:
        return None
    with torch.no_grad():
        return torch.linalg.vector_norm(torch.stack([n.float() for n in torch._foreach_norm(grads)]))


def _is_tensor(x) -> bool:
    import torch

    return isinstance(x, torch.Tensor)


def _live(fn):
    """`fn`, or what it wraps where it is a wrapper of a watch that has closed (or gone)."""
    while getattr(fn, _OWNER, None) is not None:
        owner = getattr(fn, _OWNER)()
        if owner is not None and not owner._closed:
            break
        fn = getattr(fn, _ORIGINAL)
    return fn


def combined(norms: list[float]) -> float | None:
    """One step's norm before clipping: the norms of disjoint parameter sets clipped apart, as one (L2)."""
    return sum(n * n for n in norms) ** 0.5 if norms else None
