"""Timing helpers for bench/: medians of repeated runs in one process, reported as ratios."""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))


def median_time(fn, repeat: int = 5, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _rounds(baseline, candidates: dict, repeat: int) -> dict[str, list[float]]:
    """Times per round: every function runs once per round, back to back (after one warm-up each),
    so load on the machine hits all of them alike. Key "__baseline__" holds the baseline's times."""
    fns = {"__baseline__": baseline, **candidates}
    for fn in fns.values():  # warm-up
        fn()
    times = {name: [] for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return times


def compare(baseline, candidates: dict, repeat: int = 5) -> tuple[float, list[tuple[str, float]]]:
    """Median times of baseline and each candidate, run interleaved round by round; ratios are
    what to read."""
    med = {name: statistics.median(ts) for name, ts in _rounds(baseline, candidates, repeat).items()}
    return med.pop("__baseline__"), list(med.items())


def round_ratios(baseline, candidates: dict, repeat: int) -> tuple[float, dict[str, float]]:
    """Baseline median time and, per candidate, the median over rounds of (candidate / baseline of the
    same round): load that drifts between rounds cancels in each round's ratio."""
    times = _rounds(baseline, candidates, repeat)
    base = times.pop("__baseline__")
    return statistics.median(base), {name: statistics.median(t / b for t, b in zip(ts, base))
                                     for name, ts in times.items()}


def load(spec: str, *inputs: str, args=()):
    import torch

    from torchdiag.core.inputs import resolve_inputs
    from torchdiag.core.loading import load_model

    loaded = load_model(str(ROOT / "sample_models" / spec), list(args), torch.device("cpu"))
    return loaded.model, resolve_inputs(list(inputs), loaded, torch.device("cpu"))


def report(title: str, baseline: float, rows: list[tuple[str, float]]) -> None:
    print(f"\n{title}\n  baseline {baseline * 1000:8.1f} ms  1.00x")
    for name, t in rows:
        print(f"  {name:<28} {t * 1000:8.1f} ms  {t / baseline:5.2f}x")
