"""A re-check on a copy that ran out of memory, run again on fewer samples of the same batch.

The re-checks copy the model and run it again (core/invariance.py in float64, core/gates.py's short training run):
where the judged pass itself only just fit, they do not (torchvision efficientnet_b7 at 600² and transformers ALIGN,
at a batch of 3 under the zoo's 16 GiB cap: their `vanishing-grad` warnings stayed unchecked, where at a batch of 2
the same re-check had cleared them). What they ask holds for any batch (does the loss depend on a parameter at all;
does a few steps' training lift a gradient), so the first half of the samples answers it too, at half the memory.
Only torchdiag's own made-up targets can follow the cut: not with a --batch target, nor under torchrun (each rank's
rows), nor for inputs whose tensors do not all lead with the batch."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import ModelError, out_of_memory


def first_samples(inputs, ctx) -> tuple[Any, int, int] | None:
    """(the inputs cut to their first half of samples, kept, of); None where the cut cannot be made."""
    n = inputs.batch_size
    tensors = [t for _, t in inputs.tensors()]
    if ctx.batch_target is not None or ctx.rows is not None or inputs.samples is not None or not n or n < 2:
        return None
    if not tensors or any(t.dim() == 0 or t.shape[0] != n or getattr(t, "is_nested", False) for t in tensors):
        return None
    k = n // 2
    return inputs.map(lambda t: t[:k]), k, n


def retried(attempt: Callable, inputs, ctx, notes: list, what: str):
    """attempt(inputs); when it runs out of memory, attempt(the first half of the samples) once, said in `notes`
    ("<what> on k of n samples: ..."). Any other failure, or one that cannot be cut, is raised as it was."""
    import gc

    try:
        return attempt(inputs)
    except ModelError as exc:
        cut = first_samples(inputs, ctx) if out_of_memory(exc) else None
        if cut is None:
            raise
        why = exc.message
    gc.collect()   # the failed attempt's copy and activations, held by its traceback until here
    fewer, k, n = cut
    out = attempt(fewer)
    notes.append(f"{what} on {k} of the {n} samples: with all {n} the copy ran out of memory ({why})")
    return out
