"""The gradient norm before clipping. A loop that clips (`torch.nn.utils.clip_grad_norm_`) hands the optimizer
gradients of norm at most max_norm, so the norm watch measures at the step is flat at max_norm and no explosion can
show (a review: AdamW at lr 1.0 clipped at 1, the norm 1.0 at every step). clip_grad_norm_ returns the total norm
before clipping: while watching it is wrapped, and each step's returned norms (device tensors, no sync) go to the
read with the losses. A loop that bound the function by name before watching started (`from torch.nn.utils import
clip_grad_norm_` in the Python API) keeps the original: its norms stay the clipped ones."""
from __future__ import annotations

import functools
import weakref


class ClipNorms:
    """clip_grad_norm_'s returned norms since the last step of the clock (taken) or of another optimizer (dropped)."""

    def __init__(self, engine):
        self._engine = weakref.ref(engine)
        self._since: list = []
        self._originals: list = []
        self.seen = False     # the loop clipped at least once while watched

    def attach(self) -> None:
        import torch.nn.utils as utils
        from torch.nn.utils import clip_grad

        original = clip_grad.clip_grad_norm_
        ref = weakref.ref(self)

        @functools.wraps(original)
        def clip_grad_norm_(*args, **kwargs):
            total = original(*args, **kwargs)
            me = ref()
            engine = me._engine() if me is not None else None
            if engine is not None and not engine.closed and getattr(total, "ndim", None) == 0:
                me._since.append(total.detach())
                me.seen = True
            return total

        for module in (clip_grad, utils):
            if getattr(module, "clip_grad_norm_", None) is original:
                # by name: the engine is deep-copied with a model that holds its hooks (watch's replay), and a
                # module object cannot be
                self._originals.append((module.__name__, original))
                module.clip_grad_norm_ = clip_grad_norm_  # type: ignore[attr-defined]

    def close(self) -> None:
        import sys

        for name, original in self._originals:
            sys.modules[name].clip_grad_norm_ = original  # type: ignore[attr-defined]
        self._originals, self._since = [], []

    def take(self) -> list:
        """The clock stepped: the norms its gradients had before clipping (several: param groups clipped apart)."""
        out, self._since = self._since, []
        return out

    def drop(self) -> None:
        """Another optimizer stepped: what was clipped since was its gradients."""
        self._since = []


def combined(norms: list[float]) -> float | None:
    """One step's norm before clipping: the norms of parameter sets clipped apart, as one (root of the squares)."""
    return sum(n * n for n in norms) ** 0.5 if norms else None
