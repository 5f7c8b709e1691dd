"""torch.utils.checkpoint's reentrant form, seen from a hook: it runs the checkpointed function under no_grad in
forward, and again with grad on in backward when an input needs a gradient. A module call inside that first run
is not the call the backward differentiates (recording.py names the cut; reach.FirstCalls waits for the recompute).
Found on the stack, only for calls made with grad off."""
from __future__ import annotations


def checkpoint_inputs() -> list[tuple]:
    """The inputs of every reentrant checkpoint whose forward this call runs inside, innermost first ([]: none)."""
    import sys
    import types

    try:
        from torch.utils.checkpoint import CheckpointFunction
    except ImportError:   # a torch without it
        return []
    code = CheckpointFunction.forward.__code__
    out = []
    frame: types.FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_code is code:
            out.append(tuple(frame.f_locals.get("args", ())))
        frame = frame.f_back
    return out


def _needs_grad(args: tuple) -> bool:
    import torch

    return any(isinstance(a, torch.Tensor) and a.requires_grad for a in args)


def recomputed() -> bool:
    """Is this call inside a reentrant checkpoint's forward that a backward will run again: one of the enclosing
    checkpoints (nested ones: the outer's) has an input that needs a gradient? (Its outputs here carry no graph.)"""
    return any(map(_needs_grad, checkpoint_inputs()))


def never_recomputed() -> bool:
    """Inside reentrant checkpoints none of whose inputs needs a gradient: no backward runs it again, and its
    parameters get none (the cut is the checkpoint's). With an input that needs one (an enclosing checkpoint's too), a
    no_grad met there is the user's, inside the function or around the checkpoint (a review)."""
    frames = checkpoint_inputs()
    return bool(frames) and not any(map(_needs_grad, frames))
