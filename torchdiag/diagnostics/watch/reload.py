"""reload-restores-nothing: a load_state_dict whose tensors are the model's own. `torch.nn.Module.load_state_dict`
is wrapped while a watch is open (not hooked on the model: a hook in the model's own dicts went into what
torch.save(model) pickles, and failed there), and each call into a watched model is asked (Engine.loading)."""
from __future__ import annotations

import functools
import weakref

ORIGINAL = "_torchdiag_original"   # on a wrapper: the function it wraps
OWNER = "_torchdiag_owner"         # on a wrapper: its engine, weakly (closed or gone: a pass-through)


def attach(engine):
    """Wrap Module.load_state_dict for `engine`; the wrapper (for detach)."""
    import torch

    original = torch.nn.Module.load_state_dict
    ref = weakref.ref(engine)

    @functools.wraps(original)
    def load_state_dict(module, state_dict, *args, **kwargs):
        owner = ref()
        if owner is not None and not owner.closed:
            owner.loading(module, state_dict)
        return original(module, state_dict, *args, **kwargs)

    setattr(load_state_dict, ORIGINAL, original)
    setattr(load_state_dict, OWNER, ref)
    torch.nn.Module.load_state_dict = load_state_dict
    return load_state_dict


def detach(wrapper) -> None:
    """Put back what `wrapper` wrapped, past wrappers of watches closed before it, where it is still the one
    installed; one installed over it later unwraps it when it closes."""
    import torch

    if wrapper is None or torch.nn.Module.load_state_dict is not wrapper:
        return
    fn = getattr(wrapper, ORIGINAL)
    while getattr(fn, OWNER, None) is not None:
        owner = getattr(fn, OWNER)()
        if owner is not None and not owner.closed:
            break
        fn = getattr(fn, ORIGINAL)
    torch.nn.Module.load_state_dict = fn  # type: ignore[method-assign]
