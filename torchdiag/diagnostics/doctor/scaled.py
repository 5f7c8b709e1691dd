"""doctor's one step under --amp fp16: what the first steps of fp16 training do. A fresh GradScaler
starts at 2**16, which overflows the gradients of many healthy models; training then skips the step,
halves the scale and tries again on the next batch. Here the same batch is run again (forward + scaled
backward) until the gradients fit, so the update check judges a step that training would take. Only
when no scale down to 2**16 * 0.5**MAX_BACKOFFS helps is the step reported as skipped."""
from __future__ import annotations

from ...core import train
from ...core.readback import read_back
from ...core.scaling import scale_facts
from ...core.tracking import run_forward

MAX_BACKOFFS = 24        # 2**16 → 2**-8: an overflow that survives this is not a scale problem


def fit_scale(work, inputs, ctx, scaler, optimizer, agreed=None) -> bool:
    """Unscale the gradients for `optimizer`; while they hold inf/NaN, halve the scale (scaler.update,
    as a skipped step does) and run the forward and backward again. True when they fit (unscaled,
    ready for scaler.step), False when every scale failed. One host read per try. Under torchrun
    `agreed` sums the flag over the ranks (each holds its shard, or its DDP-ignored gradients), so every
    rank retries through the wrapped copy together."""
    for attempt in range(MAX_BACKOFFS + 1):
        scaler.unscale_(optimizer)
        found = [scale_facts(scaler, optimizer)[1]]
        if not read_back(agreed(found) if agreed is not None else found)[0]:
            return True
        if attempt == MAX_BACKOFFS:
            return False
        scaler.update()
        work.zero_grad(set_to_none=True)
        with ctx.seeded(), ctx.autocast():
            out = run_forward(work, inputs, phase="forward (fp16 loss-scale backoff)")
            value = ctx.loss()(out)
        train.backward(scaler.scale(value), hint="the model's own code raised in backward")
    return False
