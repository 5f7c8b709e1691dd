"""The hook object a watch puts on a user's model (Engine._hook_root). Its name and place are kept: a model saved
whole (torch.save(model)) while watched refers to it, and loads only where `torchdiag.diagnostics.watch.hooks` imports
(a state_dict refers to nothing of ours)."""
from __future__ import annotations

_HOOK_DICTS = ("_forward_pre_hooks", "_forward_hooks")
_HOOK_FLAGS = ("_forward_pre_hooks_with_kwargs", "_forward_hooks_with_kwargs", "_forward_hooks_always_called")


class ModuleHook:
    """A watch's forward (pre-)hook on a model: the engine's method, for that model only.
    - Copied with the model (copy.deepcopy: an EMA model, the best model so far) or pickled with it (torch.save(model),
      pickle.dumps), it is one that does nothing and takes itself off the copy at its first call (a review: deepcopy
      copied the whole engine and raised for a later episode's model; torch.save raised, the engine cannot be pickled).
    - A shallow copy (copy.copy) shares the model's hooks: called for another module, it does nothing (the engine
      stopped with a KeyError)."""
    __slots__ = ("fn", "owner")

    def __init__(self, fn=None, owner=None):
        # an id, not a weak reference: torch.compile traces hooks, and a weak reference's call breaks its graph
        self.fn, self.owner = fn, id(owner) if owner is not None else None

    def __call__(self, module, *args, **kwargs):
        if self.fn is None:
            _drop(module, self)
            return None
        if id(module) != self.owner:
            return None
        return self.fn(module, *args, **kwargs)

    def __deepcopy__(self, memo) -> ModuleHook:
        return ModuleHook()

    def __reduce__(self):
        return ModuleHook, ()


def _drop(module, hook: ModuleHook) -> None:
    """Take `hook` off `module` (torch iterates over a tuple of the hooks made before calling them)."""
    for name in _HOOK_DICTS:
        hooks = getattr(module, name, None) or {}
        for key in [k for k, h in hooks.items() if h is hook]:
            del hooks[key]
            for flags in _HOOK_FLAGS:
                getattr(module, flags, {}).pop(key, None)
