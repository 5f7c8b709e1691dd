"""The hooks a watch puts on a user's model (Engine._hook_root), kept out of what the run makes of that model:
- a copy or a save (copy.deepcopy, copy.copy, torch.save(model), pickle) is made without them, through a reducer for
  the model's class in copyreg's dispatch table while it is watched: a checkpoint saved whole under watch loads where
  torchdiag is not installed (it referred to this module before), and an EMA copy carries no hook;
- torch.jit.script, wrapped while any model is watched, compiles the models with the watch's hooks set aside (it
  compiles every forward hook, and failed on ours: a script that exports its model failed only when watched)."""
from __future__ import annotations

import contextlib
import copyreg
import functools
import weakref
from typing import Any

_HOOK_DICTS = ("_forward_pre_hooks", "_forward_hooks")
_HOOK_FLAGS = ("_forward_pre_hooks_with_kwargs", "_forward_hooks_with_kwargs", "_forward_hooks_always_called")

_live: set = set()                                 # the RootHandles not removed yet, of any engine
_claims: dict[type, tuple[int, Any]] = {}          # a hooked model's class -> (models, the reducer it had before)
_script: list = []                                 # torch.jit.script before it was wrapped, while it is


class ModuleHook:
    """A watch's forward (pre-)hook on a model: the engine's method, for that model only.
    - A shallow copy made around copy.copy (`obj.__dict__.update(model.__dict__)`) shares the model's hooks: called
      for another module, it does nothing (the engine stopped with a KeyError).
    - Copied or pickled by a pickler with a dispatch table of its own, it becomes one that does nothing and takes
      itself off the copy at its first call (deepcopy copied the whole engine; torch.save raised)."""
    __slots__ = ("fn", "owner", "train_seen", "eval_seen")

    def __init__(self, fn=None, owner=None):
        # an id, not a weak reference: torch.compile traces hooks, and a weak reference's call breaks its graph
        self.fn, self.owner = fn, id(owner) if owner is not None else None
        self.train_seen = self.eval_seen = False   # forwards with grad on traced whole (one_graph), by mode

    def __call__(self, module, *args, **kwargs):
        if self.fn is None:
            _drop(module, inert_only=True)   # not the live ones of a watch that hooks the copy itself
            return None
        if id(module) != self.owner:
            return None
        if one_graph():   # the engine takes the modes at the next backward (Engine._feed); constants written under
            if _grad_on():   # the graph's guards (the grad mode, the module's flag), at every call, never read there
                if module.training:
                    self.train_seen = True
                else:
                    self.eval_seen = True
            return None
        return self.fn(module, *args, **kwargs)

    def __deepcopy__(self, memo) -> ModuleHook:
        return ModuleHook()

    def __reduce__(self):
        return ModuleHook, ()


class RootHandle:
    """Both hooks on one model, and its part in the class's reducer and the script wrapper: removed as one."""

    def __init__(self, root, handles: list):
        self.root, self.cls, self.handles = weakref.ref(root), type(root), handles
        self.mark: ModuleHook | None = None   # the pre-hook: what it kept of forwards traced whole

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        if self in _live:
            _live.discard(self)
            _release(self.cls)


def hook_root(root, pre, post) -> RootHandle:
    """`pre` and `post` as `root`'s forward pre-hook (with kwargs) and forward hook (always called)."""
    mark = ModuleHook(pre, root)
    handle = RootHandle(root, [root.register_forward_pre_hook(mark, with_kwargs=True),
                               root.register_forward_hook(ModuleHook(post, root), always_call=True)])
    handle.mark = mark
    _live.add(handle)
    cls = type(root)
    models, before = _claims.get(cls, (0, None))
    current = copyreg.dispatch_table.get(cls)
    if current is not _reduce:   # the class's own, or one the user registered while it was watched: ours calls it
        before = current
    _claims[cls] = (models + 1, before)
    copyreg.dispatch_table[cls] = _reduce
    _wrap_script()
    return handle


def one_graph() -> bool:
    """Is the hook that asks being traced into a graph that must not break (torch.compile(fullgraph=True), dynamo's
    error_on_graph_break, a higher-order op's body)? Then none of the engine's code can run in it (a
    WeakValueDictionary's read raised in the user's forward): the hook keeps the model's mode alone. A graph that may
    break runs the engine's hook eagerly, through the break. Called by dynamo while it traces, its answer a constant;
    asked whole in here (a traced `torch.compiler.is_compiling()` in the hook moved the graph's breaks: the eval-mode
    probe of a graph that may break was lost, a review's false trained-in-eval-mode)."""
    import torch

    if not torch.compiler.is_compiling():
        return False
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator

        tx = InstructionTranslator.current_tx()
        return bool(tx.one_graph or tx.error_on_graph_break or tx.output.current_tracer.parent is not None)
    except Exception:   # another torch: the hook that can run anywhere
        return True


def _grad_on() -> bool:
    import torch

    return torch.is_grad_enabled()


# dynamo calls them while tracing, their answers constants (the grad mode is among every graph's guards)
one_graph._dynamo_marked_constant = True   # type: ignore[attr-defined]
_grad_on._dynamo_marked_constant = True    # type: ignore[attr-defined]


def _release(cls: type) -> None:
    models, before = _claims.pop(cls, (0, None))
    if models > 1:
        _claims[cls] = (models - 1, before)
    elif copyreg.dispatch_table.get(cls) is _reduce:   # another's entry made since stays
        if before is None:
            del copyreg.dispatch_table[cls]
        else:
            copyreg.dispatch_table[cls] = before
    if not _live:
        _unwrap_script()


def _reduce(obj):
    """A watched model's class, pickled or copied: as it would be (its class's own reducer where it had one), with
    the watch's hooks left out of its state."""
    before = _claims.get(type(obj), (0, None))[1]
    rv = before(obj) if before is not None else obj.__reduce_ex__(2)
    if not isinstance(rv, tuple) or len(rv) < 2:
        return rv
    out = list(rv)
    if isinstance(out[1], tuple):   # a module's state among the arguments (torch.fx's GraphModule: a review)
        out[1] = tuple(_without_ours(a) if _is_state(a) else a for a in out[1])
    if len(out) > 2 and _is_state(out[2]):
        out[2] = _without_ours(out[2])
    return tuple(out)


def _is_state(d) -> bool:
    return isinstance(d, dict) and any(name in d for name in _HOOK_DICTS)


def _without_ours(state: dict) -> dict:
    """A module's state with new hook dicts that hold none of ModuleHook, nor their flags."""
    state = dict(state)
    ours = _our_keys(state.get(name) or {} for name in _HOOK_DICTS)
    for name in _HOOK_DICTS + _HOOK_FLAGS:
        d = state.get(name)
        if d and ours & d.keys():
            state[name] = type(d)((k, v) for k, v in d.items() if k not in ours)
    return state


def _our_keys(hook_dicts, inert_only: bool = False) -> set:
    """The keys of the ModuleHooks in these hook dicts (only the inert ones, a copy's, with `inert_only`)."""
    return {k for hooks in hook_dicts for k, h in hooks.items()
            if isinstance(h, ModuleHook) and not (inert_only and h.fn)}


def _drop(module, inert_only: bool = False) -> set:
    """Take the ModuleHooks off `module`, and their flags (torch iterates over a tuple of the hooks made before
    calling them): the keys taken."""
    ours = _our_keys((getattr(module, name, None) or {} for name in _HOOK_DICTS), inert_only)
    for name in _HOOK_DICTS + _HOOK_FLAGS:
        d = getattr(module, name, None) or {}
        for key in ours & d.keys():
            del d[key]
    return ours


@contextlib.contextmanager
def _set_aside():
    """The watched models without the watch's hooks for a while; each hook dict in its order again after, with
    what was added or removed meanwhile (another thread's hooks) kept so."""
    saved, seen = [], set()
    for handle in list(_live):
        module = handle.root()
        if module is None or id(module) in seen:
            continue
        seen.add(id(module))
        dicts = [d for d in (getattr(module, n, None) for n in _HOOK_DICTS + _HOOK_FLAGS) if d is not None]
        items = [list(d.items()) for d in dicts]
        ours = _drop(module)
        saved += [(d, kept, ours, module) for d, kept in zip(dicts, items)]
    try:
        yield
    finally:
        for d, items, ours, module in saved:
            # the watch's only where it still watches the model (a review: a watch ended on another thread while
            # this one scripted, and its hooks came back for good)
            back = ours & {h.id for rh in _live if rh.root() is module for h in rh.handles}   # another watch's too
            now = dict(d)
            d.clear()
            d.update((k, v) for k, v in items if k in back or k in now)
            d.update((k, v) for k, v in now.items() if k not in d)


def _wrap_script() -> None:
    import torch

    if _script:
        return
    original = torch.jit.script

    # torch's own signature: _frames_up tells it where the caller's names are (a class's free names are looked up
    # in the frame above; a review: a scripted class that calls a module-level function failed only when watched)
    @functools.wraps(original)
    def script(obj, optimize=None, _frames_up=0, _rcb=None, example_inputs=None):
        aside = _set_aside() if isinstance(obj, torch.nn.Module) else contextlib.nullcontext()
        with aside:
            return original(obj, optimize, _frames_up + 1, _rcb, example_inputs)

    _script.append((original, script))
    torch.jit.script = script


def _unwrap_script() -> None:
    import torch

    if _script:
        original, script = _script.pop()
        if torch.jit.script is script:   # a wrapper made over ours since stays, and passes through
            torch.jit.script = original
