"""torch.utils.checkpoint's reentrant form, seen from a hook: it runs the checkpointed function under no_grad in
forward, and again with grad on in backward when an input needs a gradient. A module call inside that first run
is not the call the backward differentiates (recording.py names the cut; reach.FirstCalls waits for the recompute).
Found on the stack, only for calls made with grad off."""
from __future__ import annotations


def checkpoint_inputs() -> tuple | None:
    """The inputs of the reentrant checkpoint whose forward this call runs inside, or None (not inside one)."""
    import sys
    import types

    try:
        from torch.utils.checkpoint import CheckpointFunction
    except ImportError:   # a torch without it
        return None
    code = CheckpointFunction.forward.__code__
    frame: types.FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_code is code:
            return tuple(frame.f_locals.get("args", ()))
        frame = frame.f_back
    return None


def recomputed() -> bool:
    """Is this call (grad off) inside a reentrant checkpoint's forward whose backward will run it again: an input
    needs a gradient and grad was on around the checkpoint? (Its outputs here carry no graph.)"""
    import torch

    args = checkpoint_inputs()
    return args is not None and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args)
