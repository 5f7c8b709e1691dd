"""Estimated peaks over batch sizes, and the largest batch size that fits a budget."""
from __future__ import annotations

from .estimated import estimate
from .options import MAX_BATCH


class Peaks:
    """Estimated peak per batch size, each estimated once."""

    def __init__(self, model, inputs, opts, ctx, emulate: str, known: dict[int, int] | None = None):
        self.model, self.inputs, self.opts, self.ctx, self.emulate = model, inputs, opts, ctx, emulate
        self.cache: dict[int, int] = dict(known or {})

    def __call__(self, bs: int) -> int:
        if bs not in self.cache:
            self.cache[bs] = estimate(self.model, self.inputs, self.opts, self.ctx, bs, self.emulate).peak
        return self.cache[bs]


def sweep(peak_at: Peaks, sizes, budget: int | None) -> list[dict]:
    rows = []
    for bs in sizes:
        peak = peak_at(bs)
        rows.append({"batch_size": bs, "peak_bytes": peak, "fits": None if budget is None else peak <= budget})
    return rows


def largest_fitting(peak_at: Peaks, budget: int, limit: int = MAX_BATCH) -> int:
    """Largest batch size whose estimated peak ≤ budget (0 if even 1 does not fit). Peak memory
    is close to affine in the batch size, so a line through sizes 1 and 2 proposes a size and
    estimates at and around it confirm it; a bisection over estimates settles anything else."""
    p1 = peak_at(1)
    if p1 > budget:
        return 0
    p2 = peak_at(2)
    if p2 > budget:
        return 1
    slope = max(p2 - p1, 1)
    guess = max(2, min(limit, 1 + (budget - p1) // slope))
    lo, hi = 2, None  # lo fits; hi does not
    if peak_at(guess) <= budget:
        lo = guess
        if guess >= limit:
            return limit
        if peak_at(guess + 1) > budget:
            return guess
        step = max(1, guess // 16)
        while hi is None:
            nxt = min(limit, lo + step)
            if peak_at(nxt) <= budget:
                lo = nxt
                if nxt >= limit:
                    return limit
                step *= 2
            else:
                hi = nxt
    else:
        if peak_at(guess - 1) <= budget:
            return guess - 1
        hi = guess - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if peak_at(mid) <= budget:
            lo = mid
        else:
            hi = mid
    return lo
