"""edits-input: the forward writes into its own input tensors, in place (`x.mul_(2)`, `x[mask] = 0`).

torchdiag hands every forward the values the first one got (core/inputs.ModelInputs.call), so its other
verdicts are not moved by it. In the user's loop the batch itself changes: a batch that is a view of data kept
in memory (`X[i:i + b]` of a preloaded tensor) drifts every epoch, and anything that reads the batch after the
forward (a metric, a second forward, a replay) reads other values. Located with one more forward on a copy of
the inputs (eval mode, then train mode for a write it did not see): the module running when an input's version
counter moves."""
from __future__ import annotations

from ...core.tracking import ForwardHooks
from .checklist import Checklist
from .shared import name

HINT = ("write to a new tensor instead (x = x * 2, not x.mul_(2); x = x.clone() first when it must be in place): "
        "the caller's batch is changed, and a batch that is a view of data kept in memory drifts every epoch")


class _Writer(ForwardHooks):
    """The module running when the version of an input tensor moves, seen at each module call's start and end."""

    def __init__(self, model, watched: list):
        super().__init__(model)
        self.watched = [(n, t, t._version) for n, t in watched]
        self.stack: list[str] = []
        self.found: dict[str, str] = {}   # input name -> module

    def _scan(self, where: str) -> None:
        for n, t, v in self.watched:
            if n not in self.found and t._version != v:
                self.found[n] = where

    def _pre(self, mod, args):
        self._scan(self.stack[-1] if self.stack else "")
        self.stack.append(self.names.get(id(mod), "?"))

    def _post(self, mod, args, out):
        self._scan(self.stack[-1] if self.stack else "")
        if self.stack:
            self.stack.pop()


def check_edits(work, inputs, ck: Checklist) -> None:
    """A warning per run when some forward wrote into an input (ModelInputs.written), naming where."""
    written = inputs.written()
    if not written:
        return
    where = _locate(work, inputs, written)
    shown = ", ".join(f"{n} (written in {name(where[n])})" if n in where else n for n in written)
    ck.find("inputs", "edits-input", "warning", name(where[written[0]]) if written[0] in where else "",
            f"the forward writes into its input in place: {shown}; the caller's tensor is changed by every forward "
            "(torchdiag's other checks each ran on the first values)", HINT,
            verdict=f"forward writes into {len(written)} input tensor(s)")


def _locate(work, inputs, written: list[str]) -> dict[str, str]:
    """{input: module} from one forward on a copy of the inputs in eval mode, then, for what it did not find
    (a write in train mode only), one in train mode; an explanation only: a failure leaves it unlocated."""
    import torch

    found: dict[str, str] = {}
    for training in (False, True):
        copy = inputs.clone()
        watched = [(n, t) for n, t in copy.tensors() if n in written and n not in found]
        if not watched:
            break
        try:
            work.train(training)
            with torch.no_grad(), _Writer(work, watched) as w:
                copy.call(work)
                w._scan("")           # after the root's last call: the root's own code
            found.update(w.found)
        except Exception:
            pass
    return found
