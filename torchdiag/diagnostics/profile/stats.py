"""Step-time statistics (stdlib only)."""
from __future__ import annotations

import math


def percentile(values, q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), q in [0, 100]."""
    vals = sorted(values)
    if not vals:
        return float("nan")
    rank = (len(vals) - 1) * q / 100.0
    lo, hi = math.floor(rank), math.ceil(rank)
    return vals[lo] + (vals[hi] - vals[lo]) * (rank - lo)


def step_stats(times_ms) -> dict:
    n = len(times_ms)
    mean = sum(times_ms) / n
    std = math.sqrt(sum((t - mean) ** 2 for t in times_ms) / (n - 1)) if n > 1 else 0.0
    return {"mean": mean, "median": percentile(times_ms, 50), "p90": percentile(times_ms, 90),
            "min": min(times_ms), "max": max(times_ms), "std": std, "steps": n}
