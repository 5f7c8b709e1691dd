"""nancheck under torchrun with --wrap ddp|fsdp: the one flagged forward+backward every rank makes runs on
the wrapped copy (ctx.wrapped_copy), so the gradients checked are the ones after the reduction. What the
values call for afterwards (locating a non-finite value, the anomaly pass, the float32 reference, --steps)
runs on this rank's own model and makes no collective: a rank may take it whatever its peers do.

A rank whose own pass is finite while its reduced gradients are not gets `non-finite-after-reduction`:
another rank's gradients carried the NaN/Inf in (that rank's findings name where it started)."""
from __future__ import annotations

from ...core.distributed import inner
from .flags import flagged_pass, set_rng_state


def wrapped_pass(model, inputs, loss_fn, ctx, state):
    """(ran, report): ran is False without a wrapper. Under one, the flagged pass on the wrapped copy
    from RNG state `state` (put back afterwards for the local passes); report is None when anything
    in it was non-finite."""
    work = ctx.wrapped_copy(model, "to run the pass wrapped")
    if work is None:
        return False, None
    amp = ctx.autocast if ctx.precision.amp else None
    set_rng_state(state, ctx.device)
    try:
        rep = flagged_pass(work, inputs, loss_fn, autocast=amp, outer=None if inner(work) is work else work)
    finally:
        set_rng_state(state, ctx.device)
    if ctx.spec.wrap == "fsdp":   # each rank read its own shard of the reduced gradients: any rank's NaN counts
        from ...core.distributed import agree

        rep = None if agree([rep is None], ctx.device)[0] else rep
    return True, rep


def report_reduced(result, reduced_finite: bool) -> None:
    """The wrapped pass was non-finite but this rank's own pass found nothing: the reduction brought it."""
    if reduced_finite or any(f.severity == "error" for f in result.findings):
        return
    result.add("non-finite-after-reduction", "error", "", "the parameter gradients are non-finite after the "
               "reduction, though this rank's own forward and backward are finite: another rank's gradients "
               "carry NaN/Inf into the average",
               hint="look at the findings of the other ranks: they name where the value first went non-finite")
    result.data["reduced_grads_finite"] = False
    # the summary's gradient rows are this rank's own pass: said so beside the error (a sweep: "all gradients finite"
    # under it read as a contradiction)
    result.summary = [(k, f"{v} (this rank's own pass, before the reduction)" if k in ("Backward", "Parameter gradients")
                       else v) for k, v in result.summary]
