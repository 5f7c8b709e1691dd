"""A re-check on a copy that ran out of memory, run again on fewer samples of the same batch.

The re-checks copy the model and run it again (core/invariance.py in float64, core/gates.py's short training run):
where the judged pass itself only just fit, they do not (torchvision efficientnet_b7 at 600² and transformers ALIGN,
at a batch of 3 under the zoo's 16 GiB cap: their `vanishing-grad` warnings stayed unchecked, where at a batch of 2
the same re-check had cleared them). Run again on the first half of the samples, at about half the memory.

A cut batch is not always the same question: what mixes samples (a batch-statistics normalisation, `h - h.mean(0)`)
can change an answer there (a review: a branch centred over the batch is exactly 0 on one sample, and its weight
looked invariant). So the retry runs only where the parameters asked get, on the cut, gradients of the size they got
on the whole batch (`agrees`: within SAME, neither of them zero); else the plain verdicts stand, said. Only
torchdiag's own made-up targets can follow the cut: not with a --batch target, nor under torchrun (each rank's rows),
nor for inputs whose tensors do not all lead with the batch (or hold a batch × batch matrix, an adjacency)."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import ModelError, out_of_memory

SAME = 100.0   # a parameter's grad/weight on the cut within this factor of the whole batch's: the same question


def first_samples(inputs, ctx) -> tuple[Any, int, int] | None:
    """(the inputs cut to their first half of samples, kept, of); None where the cut cannot be made."""
    n = inputs.batch_size
    if ctx.batch_target is not None or ctx.rows is not None or not n or n < 2:
        return None
    cut = inputs.first(n // 2)
    return (cut, n // 2, n) if cut is not None else None


def retried(attempt: Callable, inputs, ctx, notes: list, what: str, agrees: Callable | None = None):
    """attempt(inputs); when it runs out of memory, attempt(the first half of the samples) once, said in `notes`
    ("<what> on k of n samples: ..."), if `agrees(cut inputs)` finds nothing that differs there (it returns why,
    or None). Any other failure, or one that cannot be cut, is raised as it was; a retry that differs or fails is
    raised saying both."""
    import gc

    from .train import NoRoom

    try:
        return attempt(inputs)
    except ModelError as exc:
        # ran out, or refused before it could (NoRoom) where half the activations it asked would make it fit
        cut = first_samples(inputs, ctx) if out_of_memory(exc) or _half_fits(exc) else None
        if cut is None:
            raise
        why, refused = exc.message, not out_of_memory(exc)
    gc.collect()   # the failed attempt's copy and activations, held by its traceback until here
    fewer, k, n = cut
    ran_out = f"with all {n} samples the copy {'did not fit' if refused else 'ran out of memory'} ({why})"
    share, ctx.share = ctx.share, k / n   # the copies made for the cut are asked that part of the activations
    try:
        differs = agrees(fewer) if agrees is not None else None
        out = attempt(fewer) if differs is None else None
    except ModelError as exc:   # a refusal stays one, however the retry failed (callers say "no memory for the copy")
        raise (NoRoom if refused or isinstance(exc, NoRoom) else ModelError)(
            f"{ran_out}; on the first {k}: {exc.message}") from exc
    finally:
        ctx.share = share
    if differs is not None:
        raise (NoRoom if refused else ModelError)(f"{ran_out}, and the first {k} do not ask the same question: "
                                                  f"{differs}")
    notes.append(f"{what} on {k} of the {n} samples: {ran_out}")
    return out


def _half_fits(exc) -> bool:
    """A refusal (core.train.NoRoom) that half the activations it counted would have let through."""
    acts = getattr(exc, "activations", 0)
    return acts > 0 and exc.needed - acts / 2 <= exc.free


def alike(ratios: dict[str, float], cut: dict[str, float]) -> str | None:
    """None when each name's grad/weight on the cut (`cut`) is within SAME of the whole batch's (`ratios`), neither
    zero; else which one differs."""
    for n, full in ratios.items():
        part = cut.get(n, 0.0)
        if not (full > 0 and part > 0 and 1 / SAME <= part / full <= SAME):
            return f"{n}'s gradient is {part:.3g} of its weight there, {full:.3g} on the whole batch"
    return None
