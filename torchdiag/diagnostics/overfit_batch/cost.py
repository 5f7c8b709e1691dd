"""How far a cheap run may be extended: the step cap past EXTEND × DEFAULT_STEPS, from the work one step does.

The default cap (2000 steps) bounds the time of a run still falling toward its target. A small network
(a 2-4-1 sigmoid net on XOR: 96 forward FLOPs) can need 7,000 steps and take 2 s for them: stopping it at
2000 leaves an inconclusive `not-overfit-yet` that more steps would settle. The cap grows while the
extra steps' work stays under WORK (FLOPs): counted once, on one forward of the batch (torch's dispatch-level
counter: matmuls, convolutions, attention), times 3 for the backward, and never under two FLOPs per trainable
value (the optimizer touches each). Deterministic: the same model and batch get the same cap on any machine,
unlike a time limit."""
from __future__ import annotations

from .options import DEFAULT_STEPS, EXTEND

WORK = 5e10          # FLOPs the steps past the default cap may add (18,000 steps of a 1 MFLOP forward)
MOST = 40            # the cap never exceeds MOST × DEFAULT_STEPS (20,000 steps)


def cheap_cap(trainer) -> int:
    """The step cap for this run's model and batch: EXTEND × DEFAULT_STEPS, raised in DEFAULT_STEPS
    increments to MOST × DEFAULT_STEPS while the added steps' work stays under WORK."""
    base = EXTEND * DEFAULT_STEPS
    per_step = step_flops(trainer)
    if per_step is None:
        return base
    extra = int(WORK // max(per_step, 1.0)) // DEFAULT_STEPS * DEFAULT_STEPS
    return max(base, min(MOST * DEFAULT_STEPS, base + extra))


def step_flops(trainer) -> float | None:
    """3 × the forward's counted FLOPs (forward and backward), at least 2 per trainable value; None when the
    forward cannot be counted (the counter raised: no extension past the default cap). The forward runs on the
    trained copy under no_grad with the RNG state restored after, so the run's own curve is unchanged."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    devices = [trainer.ctx.device] if trainer.ctx.device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=devices), torch.no_grad(), trainer.autocast(), counter:
            trainer.batch.call(trainer.work)
    except Exception:   # a model the counter cannot follow: keep the default cap
        return None
    values = sum(p.numel() for _, p in trainer.trainable)
    return max(3.0 * counter.get_total_flops(), 2.0 * values)
