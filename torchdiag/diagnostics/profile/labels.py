"""Module labels: `record_function("module::<path>")` ranges opened and closed by forward hooks."""
from __future__ import annotations

from types import SimpleNamespace

from ...core.tracking import ForwardHooks, describe

MODULE_PREFIX = "module::"
PHASE_PREFIX = "torchdiag::"
ROOT_LABEL = "(root)"


class ModuleLabels(ForwardHooks):
    """Forward pre/post hooks that open and close `record_function("module::<path>")` ranges.
    Keeps the open calls on a stack, so a failure names the innermost module and the ranges
    left open by the exception can be closed."""

    def __init__(self, model):
        super().__init__(model)
        self.types = {name: type(mod).__name__ for name, mod in model.named_modules()}
        self.stack: list = []
        self.compiled = False   # a torch.compile'd part, timed as one (hooked)

    def hooked(self):
        """Not the modules inside a torch.compile'd one: a label there breaks its graph (a compiled MLP ran as three
        graphs, 16x slower than the user's), so a compiled part is timed as one."""
        from ...core.loading import compiled_root

        inside = {id(m) for w in self.model.modules() if (inner := compiled_root(w)) is not None for m in inner.modules()}
        self.compiled = bool(inside)
        return [m for m in super().hooked() if id(m) not in inside]

    def __enter__(self):
        # torch's _RecordFunctionFast (what torch.compile uses for its own annotations) opens the same
        # kind of range as record_function at ~0.6 µs instead of ~6 µs per call. It is private:
        # fall back to the public record_function when it is missing.
        try:
            from torch._C._profiler import _RecordFunctionFast as fast
        except ImportError:
            fast = None
        if fast is None:
            from torch.autograd.profiler import record_function as fast
        self._rf = fast
        return super().__enter__()

    def __exit__(self, *exc):
        self.close_open()
        return super().__exit__(*exc)

    # A range goes on the stack before it is opened and leaves it after it is closed: an interrupt
    # between the two statements leaves it where close_open() closes it (closing one twice, or one
    # never opened, raises there and is ignored).
    def _pre(self, mod, args):
        name = self.names.get(id(mod), "?")
        if _in_backward():   # activation checkpointing's recompute: backward's time, not a second forward (a sweep:
            self.stack.append((name, mod, args, None))   # the root's self time went negative, ranges unclosed)
            return
        rf = self._rf(MODULE_PREFIX + (name or ROOT_LABEL))
        self.stack.append((name, mod, args, rf))
        rf.__enter__()

    def _post(self, mod, args, output):
        if self.stack:
            rf = self.stack[-1][3]
            if rf is not None:
                rf.__exit__(None, None, None)
            self.stack.pop()

    @property
    def failing(self):
        """The innermost open module call (name, type, inputs), or None: what core's forward_error names."""
        if not self.stack:
            return None
        name, mod, args, _ = self.stack[-1]
        return SimpleNamespace(name=name, type=type(mod).__name__, inputs=describe(tuple(args)))

    def close_open(self):
        while self.stack:
            try:
                rf = self.stack.pop()[3]
                if rf is not None:
                    rf.__exit__(None, None, None)
            except Exception:
                pass


def _in_backward() -> bool:
    """Inside autograd's backward (a module's forward run again there by torch.utils.checkpoint)."""
    import torch

    try:
        return torch._C._current_graph_task_id() != -1
    except Exception:   # noqa: BLE001 - private: without it, the recompute is labelled as before
        return False


def module_label(event_name: str) -> str | None:
    """The module path of a `module::` range ('' for the root), None for any other event."""
    if not event_name.startswith(MODULE_PREFIX):
        return None
    name = event_name[len(MODULE_PREFIX):]
    return "" if name == ROOT_LABEL else name


def is_ours(name: str) -> bool:
    """Ranges torchdiag or the profiler's schedule open: not operators of the model."""
    return name.startswith(MODULE_PREFIX) or name.startswith(PHASE_PREFIX) or name.startswith("ProfilerStep")
