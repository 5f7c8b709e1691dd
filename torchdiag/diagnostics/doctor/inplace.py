"""inplace-autograd: an in-place edit that autograd refuses. Two facts, each observed, never read from
an error's text:

- backward fails and a second forward with saved-tensor hooks sees the version counter of a tensor
  saved for backward move (InplaceLocator): the module running at that moment did the edit;
- the train-mode forward raises from an in-place op on a leaf that requires grad, or a view of one
  (LeafInplaceWatch, a torch-function mode that notes which call raised)."""
from __future__ import annotations

import inspect

from ...core.tracking import ForwardHooks, run_forward
from ...errors import one_line
from .checklist import Checklist
from .shared import name


class InplaceLocator(ForwardHooks):
    """Forward hooks + saved-tensor hooks: a tensor saved for backward whose version counter
    moved between two hook events was edited in place by the module running in between."""

    def __init__(self, model):
        super().__init__(model)
        self.stack: list[tuple[str, str]] = []
        self.saved: dict[int, tuple] = {}
        self.found: list[tuple[str, str, str, str]] = []  # (culprit, type, saved by, shape)
        self._ctx = None

    def _scan(self):
        if not self.saved:
            return
        where = self.stack[-1] if self.stack else ("", "")
        for key in list(self.saved):
            t, version, saver = self.saved[key]
            if t._version != version:
                self.found.append((where[0], where[1], saver, "x".join(map(str, t.shape))))
                del self.saved[key]

    def _pre(self, mod, args):
        self._scan()
        self.stack.append((self.names.get(id(mod), "?"), type(mod).__name__))

    def _post(self, mod, args, out):
        self._scan()
        if self.stack:
            self.stack.pop()

    def _pack(self, t):
        saver = self.stack[-1][0] if self.stack else ""
        self.saved.setdefault(id(t), (t, t._version, saver))
        return t

    def __enter__(self):
        import torch

        super().__enter__()
        self._ctx = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self._ctx.__enter__()
        return self

    def __exit__(self, *exc):
        self._ctx.__exit__(*exc)
        super().__exit__(*exc)
        self._scan()
        return False


def leaf_inplace_watch():
    """A torch-function mode for the train-mode forward; `.refused` is the exception an in-place op
    on a leaf that requires grad (or a view of one) raised, if any."""
    from torch.overrides import TorchFunctionMode

    class LeafInplaceWatch(TorchFunctionMode):
        refused = None

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            try:
                return func(*args, **kwargs)
            except Exception as exc:   # classified by the call that raised, then re-raised untouched
                if _inplace_on_leaf(func, args, kwargs):
                    self.refused = exc
                raise

    return LeafInplaceWatch()


def _inplace_on_leaf(func, args, kwargs) -> bool:
    import torch

    target = args[0] if args and isinstance(args[0], torch.Tensor) else None
    if target is None or not torch.is_grad_enabled() or not target.requires_grad:
        return False
    base = target._base
    if not (target.is_leaf or (base is not None and base.is_leaf and base.requires_grad)):
        return False
    op = getattr(func, "__name__", "")
    if op == "__setitem__" or (op.startswith("__i") and op.endswith("__")) or (op.endswith("_") and not op.endswith("__")):
        return True
    try:   # functional forms with an inplace= argument (F.relu(x, inplace=True))
        return inspect.signature(func).bind(*args, **kwargs).arguments.get("inplace") is True
    except (TypeError, ValueError):
        return False


def report_inplace(ck: Checklist, culprit: str, kind: str, saver: str | None, shape: str, exc) -> None:
    saved = f"; the tensor ({shape}) was saved for backward by {name(saver)}" if saver is not None else ""
    ck.find("inplace", "inplace-autograd", "error", name(culprit),
            f"{name(culprit)} ({kind}) edits in place a tensor autograd still needs{saved} ({one_line(exc, 160)})",
            "use the out-of-place form (x = x + y, not x += y; relu(inplace=False); x = x.clone() before editing)",
            verdict=f"backward fails: {name(culprit)} edits a saved tensor in place")


def locate_inplace(work, inputs, ck: Checklist, exc) -> bool:
    """After backward raised `exc`: a forward that watches the saved tensors. True (and reported)
    when one of them was edited in place."""
    import torch

    work.train()
    loc = InplaceLocator(work)
    with torch.enable_grad(), loc:
        run_forward(work, inputs, phase="forward in train mode (locating the in-place edit)")
    if not loc.found:
        return False
    culprit, kind, saver, shape = loc.found[0]
    report_inplace(ck, culprit, kind, saver, shape, exc)
    return True
