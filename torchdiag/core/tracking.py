"""Forward hooks that record which module ran, with what shapes — and which one raised."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ..errors import ModelError, one_line


def describe(obj: Any, limit: int = 4) -> str:
    """A short shape description of a forward output or input: `8x10`, `(8x10, 8)`, `{logits: 2x5}`."""
    import torch

    if isinstance(obj, torch.Tensor):
        shape = "x".join(str(d) for d in obj.shape) if obj.dim() else "scalar"
        return shape if obj.is_floating_point() else f"{shape} {str(obj.dtype).replace('torch.', '')}"
    if isinstance(obj, (tuple, list)):
        parts = [describe(x, limit) for x in obj[:limit]]
        more = ", …" if len(obj) > limit else ""
        body = ", ".join(parts) + more
        return f"({body})" if isinstance(obj, tuple) else f"[{body}]"
    if isinstance(obj, dict):
        items = list(obj.items())
        body = ", ".join(f"{k}: {describe(v, limit)}" for k, v in items[:limit])
        return "{" + body + (", …" if len(items) > limit else "") + "}"
    if obj is None:
        return "None"
    if hasattr(obj, "__dataclass_fields__") or hasattr(obj, "_fields"):
        return type(obj).__name__
    return type(obj).__name__


@dataclass
class Call:
    name: str          # module path ("" is the root)
    type: str
    depth: int
    inputs: str = ""
    output: str = ""
    done: bool = False


def module_names(model) -> dict[int, str]:
    """id(module) -> its path in `model` ("" is the root); a module reachable by two paths keeps the first."""
    names: dict[int, str] = {}
    for name, mod in model.named_modules():
        names.setdefault(id(mod), name)
    return names


class ForwardHooks:
    """`self._pre` as forward pre-hook and `self._post` as forward hook on every module of `model`
    while the `with` block runs, plus `self.names` (id(module) -> path).

    Several diagnostics watch each module call the same way; this is that mechanism written once.
    A subclass defines `_pre(mod, args)` (or `_pre(mod, args, kwargs)` with `pre_kwargs = True`) and
    `_post(mod, args, output)`; setting either to None registers no hook of that kind."""

    pre_kwargs = False
    _pre = None
    _post = None

    def __init__(self, model):
        self.model = model
        self.names = module_names(model)
        self._handles: list = []

    def __enter__(self):
        for mod in {id(m): m for m in self.model.modules()}.values():
            if self._pre is not None:
                self._handles.append(mod.register_forward_pre_hook(self._pre, with_kwargs=self.pre_kwargs))
            if self._post is not None:
                self._handles.append(mod.register_forward_hook(self._post))
        return self

    def __exit__(self, *exc):
        for h in self._handles:
            h.remove()
        self._handles.clear()
        return False


class ModuleTracker(ForwardHooks):
    """Install with `with ModuleTracker(model) as tr:`; calls are in execution (pre-hook) order."""

    pre_kwargs = True

    def __init__(self, model, record_shapes: bool = True):
        super().__init__(model)
        self.record_shapes = record_shapes
        self.calls: list[Call] = []
        self._stack: list = []

    def _pre(self, mod, args, kwargs):
        name = self.names.get(id(mod), "?")
        call = Call(name, type(mod).__name__, name.count(".") + 1 if name else 0)
        self.calls.append(call)
        # Inputs are only described if this call fails: describing every call costs time.
        self._stack.append((call, tuple(args) + tuple(kwargs.values())))

    def _post(self, mod, args, output):
        if self._stack:
            call, _ = self._stack.pop()
            call.done = True
            if self.record_shapes:
                call.output = describe(output)

    @property
    def failing(self) -> Call | None:
        """The innermost module still open after an exception: the one that raised."""
        if not self._stack:
            return None
        call, args = self._stack[-1]
        if not call.inputs:
            call.inputs = describe(args)
        return call

    def called(self) -> set[str]:
        return {c.name for c in self.calls}


def forward_error(exc: BaseException, tracker: ModuleTracker | None, phase: str = "forward", partial=None) -> ModelError:
    """A ModelError that names the module path, its type and the shapes it received."""
    call = tracker.failing if tracker else None
    if call is not None:
        where = call.name or "(root)"
        msg = f"{phase} failed in {where} ({call.type}) with input shapes {call.inputs or '()'}: {one_line(exc)}"
    else:
        msg = f"{phase} failed: {one_line(exc)}"
    hint = "the model's own code raised; fix it or the inputs (-i) and run again"
    if re.search(r"(?<![a-z])meta(?![a-z])", str(exc).lower()):
        hint = ("on --device meta tensors have no values, and this model's code reads them "
                "(.item(), if on a tensor, nonzero …): run it with --device cpu")
    err = ModelError(msg, hint=hint, partial=partial)
    err.where = call.name if call else ""
    return err


def run_forward(model, inputs, tracker: ModuleTracker | None = None, phase: str = "forward"):
    """model(*args, **kwargs); a failure becomes a ModelError naming the module (installs a
    tracker just for naming when none is given)."""
    own = tracker is None
    if own:
        tracker = ModuleTracker(model, record_shapes=True)
        tracker.__enter__()
    try:
        return inputs.call(model)
    except ModelError:
        raise
    except Exception as exc:
        raise forward_error(exc, tracker, phase) from exc
    finally:
        if own:
            tracker.__exit__(None, None, None)
