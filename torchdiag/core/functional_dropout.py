"""Dropout a model draws through torch's functions inside its own forward, off on a copy that overfit-batch trains
(core/design.py's dropout_off puts the dropout modules in eval; these calls have no module to put there)."""
from __future__ import annotations

import contextlib


def _train_flags() -> dict:
    """{function: (position, name, default) of its train flag}: torch's dropout functions, whose call with the
    flag off is what eval mode runs (the input itself)."""
    import torch
    import torch.nn.functional as F

    flags: dict = {f: (2, "training", True) for f in (F.dropout, F.dropout1d, F.dropout2d, F.dropout3d)}
    flags.update({f: (2, "training", False) for f in (F.alpha_dropout, F.feature_alpha_dropout)})
    flags.update({f: (2, "train", None) for f in (torch.dropout, torch.dropout_, torch.feature_dropout,
                                                   torch.feature_dropout_, torch.alpha_dropout, torch.alpha_dropout_,
                                                   torch.feature_alpha_dropout, torch.feature_alpha_dropout_)})
    return flags


def _rates() -> dict:
    """{function: (position, name) of its dropout rate, and of its train flag or None}: attention ops that drop
    attention weights themselves (nn.MultiheadAttention passes its own flag)."""
    import torch.nn.functional as F

    return {F.scaled_dot_product_attention: ((4, "dropout_p"), None),
            F.multi_head_attention_forward: ((10, "dropout_p"), (13, "training"))}


class FunctionalDropoutOff:
    """Dropout a model draws through torch's functions inside its own forward (BART's layers call F.dropout with
    `training=self.training`; fused attention takes `dropout_p`), made the call eval mode makes, by a
    TorchFunctionMode over one model's calls, a copy the caller owns: its train flags, which also choose gradient
    checkpointing and a VAE's sampling, are untouched.

    Every module's call enters the mode when this thread is not under it yet: a checkpointed block recomputed in
    backward (at any depth, in autograd's device threads too) must not draw a mask its forward did not, or checkpoint
    raises (a fused attention saves other tensors) or the gradients are another draw's. A backward after a forward that
    dropped holds the mode through the engine's run too (`backward`), for a checkpointed function that is no module
    call; inside a nested engine run (a reentrant checkpoint within a checkpoint, autograd.grad in a forward) only
    module calls are covered, since a mode's own calls run with it off the stack. Inside torch.compile'd code nothing
    is counted or entered (the compiled graph would guard on the count and recompile). `draws` counts the calls that
    would have dropped; `idle()`, once a step dropped nothing, takes the hooks off (the mode costs a Python call per
    torch function)."""

    def __init__(self):
        import threading

        from torch.overrides import TorchFunctionMode

        flags, rates = _train_flags(), _rates()
        owner = self

        class _Mode(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                kwargs = dict(kwargs or {})
                if func in flags:
                    args = _set(args, kwargs, flags[func][:2], False, owner._flag_on(args, kwargs, flags[func]))
                elif func in rates:
                    args = _set(args, kwargs, rates[func][0], 0.0, owner._rate_on(args, kwargs, *rates[func]))
                return func(*args, **kwargs)

        self.mode = _Mode()
        self.draws = 0
        self.live = True
        self._local = threading.local()   # per thread: module-call depth, and whether its outermost call pushed
        self._handles: list = []

    def __deepcopy__(self, memo):
        """A copy of a model carrying its hooks shares this controller, not a copy of it: its thread-local cannot be
        copied (a sweep: overfit-batch's re-check of parameters that never changed could not copy a DETR trained
        with functional dropout turned off)."""
        return self

    def _flag_on(self, args, kwargs, spec) -> bool:
        at, name, default = spec
        dropped = bool(_arg(args, kwargs, at, name, default)) and _positive(_arg(args, kwargs, 1, "p", 0.5))
        self._count(dropped)
        return dropped

    def _rate_on(self, args, kwargs, rate, flag) -> bool:
        at, name = rate
        dropped = _positive(_arg(args, kwargs, at, name, 0.0)) and (flag is None or bool(_arg(args, kwargs, *flag)))
        self._count(dropped)
        return dropped

    def _count(self, dropped: bool) -> None:
        if dropped and not _compiling():
            self.draws += 1

    def attach(self, model) -> None:
        self._detach()
        if self.live:
            for m in model.modules():
                self._handles += [m.register_forward_pre_hook(self._enter),
                                  m.register_forward_hook(self._leave, always_call=True)]

    def _detach(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def _enter(self, *_):
        if _compiling():
            return
        depth = getattr(self._local, "depth", 0)
        if not depth:
            self._local.pushed = not self._on_stack()
            if self._local.pushed:
                self.mode.__enter__()
        self._local.depth = depth + 1

    def _leave(self, *_):
        depth = getattr(self._local, "depth", 0)
        if not depth or _compiling():
            return
        self._local.depth = depth - 1
        if depth == 1 and self._local.pushed:
            self._local.pushed = False
            self.mode.__exit__(None, None, None)

    def _on_stack(self) -> bool:
        from torch.overrides import _get_current_function_mode_stack

        return any(m is self.mode for m in _get_current_function_mode_stack())

    def backward(self, loss, retain_graph: bool = False) -> None:
        """loss.backward(); after a forward that dropped, the mode held through the engine's run."""
        import torch

        run = getattr(torch.autograd.graph, "_engine_run_backward", None)   # torch's own backward ends in it
        if not (self.live and self.draws) or run is None or loss.numel() != 1 or self._on_stack():
            loss.backward(retain_graph=retain_graph)
            return
        seed = torch.ones_like(loss)
        with self.mode:
            run((loss,), (seed,), retain_graph, False, (), allow_unreachable=True, accumulate_grad=True)

    def reset(self) -> None:
        """After a forward left by an interrupt (KeyboardInterrupt is no Exception: the always-call hook does not
        run): the mode off this thread's stack."""
        if getattr(self._local, "depth", 0) and getattr(self._local, "pushed", False) and self._on_stack():
            self.mode.__exit__(None, None, None)
        self._local.depth, self._local.pushed = 0, False

    def off(self) -> None:
        """No more: hooks off, later forwards and backwards plain."""
        self.reset()
        self.live = False
        self._detach()

    def idle(self) -> None:
        """Once a step dropped nothing: later forwards and backwards run without the mode."""
        if not self.draws:
            self.off()


@contextlib.contextmanager
def modes_restored():
    """torch's function-mode stack as it was on entry: a FunctionalDropoutOff's mode pushed by a forward that an
    interrupt left (KeyboardInterrupt is no Exception: the always-call hook does not run) is not left to the caller."""
    import torch
    from torch.overrides import _get_current_function_mode_stack

    depth = len(_get_current_function_mode_stack())
    try:
        yield
    finally:
        while len(_get_current_function_mode_stack()) > depth:
            torch._C._pop_torch_function_stack()


def _compiling() -> bool:
    import torch

    return torch.compiler.is_compiling()


def _arg(args, kwargs, at: int, name: str, default=True):
    return args[at] if len(args) > at else kwargs.get(name, default)


def _positive(rate) -> bool:
    try:
        return float(rate) > 0
    except (TypeError, ValueError, RuntimeError):
        return True   # a tensor rate, or something odd: taken as a draw


def _set(args, kwargs, spec, value, change: bool):
    """args with the argument at `spec` (position, name) set to `value` when `change`."""
    if not change:
        return args
    at, name = spec
    if len(args) > at:
        return args[:at] + (value,) + args[at + 1:]
    kwargs[name] = value
    return args
