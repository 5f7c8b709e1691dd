"""How far a run may be extended past EXTEND × DEFAULT_STEPS: as far as its own measured step time affords.

The default cap (2000 steps) bounds the time of a run still falling toward its target. A small network
(a 2-4-1 sigmoid net on XOR) can need 7,000 steps and take 2 s for them: stopping it at 2000 leaves an
inconclusive `not-overfit-yet` that more steps would settle. The steps past the default cap may take
EXTRA_SECONDS more at the rate the run has kept so far, up to MOST × DEFAULT_STEPS in all.

Measured, not counted: a FLOP count (torch's dispatch-level counter) was tried first and withdrawn after a
review: it counts 0 for a float32 LSTM on CPU (mkldnn), for LayerNorm, fft and every elementwise op, so a
0.2 s/step LSTM got 20,000 steps (73 minutes), and its extra forward changed the curve of a model that keeps
state across calls. The price of a measured time: a model near the threshold can stop at different steps on a
slower or busier machine; `--steps N` is a budget that does not depend on the machine."""
from __future__ import annotations

from .options import DEFAULT_STEPS, EXTEND

EXTRA_SECONDS = 60.0   # the steps past the default cap may add about this much time, at the run's own rate
MOST = 40              # the cap never exceeds MOST × DEFAULT_STEPS (20,000 steps)


def fast_cap(steps: int, seconds: float) -> int:
    """The step cap for a run that took `steps` steps in `seconds`: EXTEND × DEFAULT_STEPS, raised in
    DEFAULT_STEPS increments to MOST × DEFAULT_STEPS while the added steps fit in EXTRA_SECONDS."""
    base = EXTEND * DEFAULT_STEPS
    if steps <= 0 or seconds <= 0:
        return base
    extra = int(EXTRA_SECONDS / (seconds / steps)) // DEFAULT_STEPS * DEFAULT_STEPS
    return max(base, min(MOST * DEFAULT_STEPS, base + extra))
