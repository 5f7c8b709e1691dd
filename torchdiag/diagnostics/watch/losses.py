"""The loss a training step computes, looked at where every loss goes through: torch.nn.functional's class and
elementwise losses (`nn.CrossEntropyLoss` and `nn.MSELoss` call them too). Patched while watching; each kind's first
LOOKS calls are looked at (a softmax before cross_entropy, an (N, 1) output against an (N,) target are there from the
first step), later calls pass straight through. A function bound before the watch began (`from torch.nn.functional
import cross_entropy` at the top of a module imported earlier) is not seen; a script run by `torchdiag watch` binds
it after."""
from __future__ import annotations

import functools
import sys
import weakref

CLASS = {"cross_entropy": "CrossEntropyLoss", "nll_loss": "NLLLoss"}   # class scores in: logits, log-probabilities
ELEMENTWISE = ("mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss")  # input against target, element by element
LOOKS = 3


class LossLooks:
    def __init__(self, engine):
        self._engine = weakref.ref(engine)
        self._originals: dict = {}
        self.looks = {"class": 0, "elementwise": 0}

    def attach(self) -> None:
        import torch.nn.functional as F

        for name in (*CLASS, *ELEMENTWISE):
            original = getattr(F, name)
            self._originals[name] = original
            setattr(F, name, self._wrap(name, original))

    def close(self) -> None:
        import torch.nn.functional as F

        for name, original in self._originals.items():
            if getattr(getattr(F, name), "__wrapped__", None) is original:   # another's patch on top stays
                setattr(F, name, original)
        self._originals.clear()

    def _wrap(self, name: str, original):
        from torch.compiler import is_compiling as compiling

        kind = "class" if name in CLASS else "elementwise"
        ref, looks = self._engine, self.looks

        @functools.wraps(original)
        def look(*args, **kwargs):
            if compiling():   # traced by torch.compile (a compiled training step): the loss alone, no graph break
                return original(*args, **kwargs)
            engine = ref()
            if looks[kind] < LOOKS and engine is not None and not engine.closed:
                x = args[0] if args else kwargs.get("input")
                y = args[1] if len(args) > 1 else kwargs.get("target")
                if engine.look_at_loss(name, _named(name), x, y):
                    looks[kind] += 1
            return original(*args, **kwargs)
        return look


def _named(name: str) -> str:
    """The loss module that called the function (`CrossEntropyLoss`), else the function (`F.cross_entropy`)."""
    from torch.nn.modules.loss import _Loss

    frame = sys._getframe(2)   # look's caller
    owner = frame.f_locals.get("self") if frame.f_code.co_name == "forward" else None
    return type(owner).__name__ if isinstance(owner, _Loss) else f"F.{name}"
