"""watch's loss-curve rules (issue 27) on simulated curves: how often `loss-diverged` fires on healthy losses, and
how often it finds a climb, as the error (a run that ends up there) or the warning (a climb that came back while
the learning rate rose).

    .venv/bin/python bench/watch_curves.py [--runs 40] [--seed 0]

No model is trained: each curve goes straight to the report's judgement (report._loss_curve), with a learning
rate that warms up linearly over the first `warm` share of the steps and then decays on a cosine (the schedule
under which the warning can fire at all).
- healthy: lengths 50-3000 steps; log-normal noise of sigma 0.05-2 around a flat, an exponentially decaying or a
  power-law loss; the noise independent from step to step, or an AR(1) correlated over ~10 or ~50 steps (a loss
  that wanders slowly); warm-up over 5% of the steps.
- held: a decaying loss that climbs from a third of the run to 2-10x where it started and stays there (the
  error's case).
- came back: a decaying loss that climbs by 2-10x while the rate warms up (over 3%, 10% or 20% of the run),
  holds a tenth of the run, and comes back over a fifth (a peak learning rate too high, recovered as it decays).
Prints, per kind, the runs with an error and with a warning (of any of the loss rules: `loss-spike` too), and the
cells where most were missed."""
from __future__ import annotations

import argparse
import itertools
import math
import random

from common import ROOT  # noqa: F401  (puts the repository on sys.path)

from torchdiag.diagnostics.watch import report
from torchdiag.diagnostics.watch.options import Options
from torchdiag.results import Result

LENGTHS = (50, 80, 150, 300, 1000, 3000)
SIGMAS = (0.05, 0.2, 0.5, 2.0)
SHAPES = {"flat": lambda i, n: 1.0,
          "decay": lambda i, n: 2 * math.exp(-8 * i / n) + 0.2,
          "power": lambda i, n: (1 + i / 10) ** -0.5}
CORRELATION = {"independent": 0, "~10 steps": 10, "~50 steps": 50}


def noise(rng: random.Random, n: int, sigma: float, steps: int) -> list[float]:
    """Log-space noise of standard deviation sigma, AR(1) with correlation time `steps` (0: independent)."""
    rho = math.exp(-1 / steps) if steps else 0.0
    out, x = [], rng.gauss(0, sigma)
    for _ in range(n):
        out.append(x)
        x = rho * x + math.sqrt(1 - rho * rho) * rng.gauss(0, sigma)
    return out


def schedule(n: int, warm: float) -> dict[int, float]:
    k = max(1, round(warm * n))
    return {i: 0.1 * min(1.0, i / k) * (1 if i <= k else 0.5 * (1 + math.cos(math.pi * (i - k) / (n - k + 1))))
            for i in range(1, n + 1)}


def judged(values: list[float], lr_at: dict[int, float]) -> str | None:
    result = Result("watch")
    report._loss_curve(result, list(enumerate(values, 1)), lr_at, Options())
    found = {f.severity for f in result.findings if f.severity in ("error", "warning")}   # loss-spike too
    return "error" if "error" in found else "warning" if found else None


def hump(i: int, start: int, rise: int, factor: float, held: int | None, fall: int) -> float:
    """The climb's factor at step i: up by `factor` over `rise` steps from `start`, held `held` steps (None: to the
    end), back over `fall` steps."""
    t = i - start
    if t < 0:
        return 1.0
    if t < rise:
        return factor ** (t / rise)
    if held is None or t < rise + held:
        return factor
    return factor ** max(0.0, 1 - (t - rise - held) / fall)


def healthy(rng, runs: int) -> dict:
    """{(correlation, sigma): {"runs", "error", "warning"}}"""
    counts = {(c, s): {"runs": 0, "error": 0, "warning": 0} for c in CORRELATION for s in SIGMAS}
    for n, sigma, shape, (corr, steps) in itertools.product(LENGTHS, SIGMAS, SHAPES, CORRELATION.items()):
        lr = schedule(n, 0.05)
        for _ in range(runs):
            eps = noise(rng, n, sigma, steps)
            verdict = judged([SHAPES[shape](i, n) * math.exp(e) for i, e in enumerate(eps)], lr)
            counts[corr, sigma]["runs"] += 1
            if verdict:
                counts[corr, sigma][verdict] += 1
    return counts


def climbs(rng, runs: int, came_back: bool) -> tuple[dict, list]:
    total, missed = {"runs": 0, "error": 0, "warning": 0, "by factor": {}}, []
    for n, sigma, factor, warm in itertools.product(LENGTHS, (0.05, 0.2, 0.5), (2, 4, 10),
                                                    (0.03, 0.1, 0.2) if came_back else (0.05,)):
        lr, found = schedule(n, warm), 0
        for _ in range(runs):
            if came_back:   # up while the rate warms up (from its middle to its end), back as it decays
                k = max(2, round(warm * n))
                shape = [hump(i, k // 2, k - k // 2, factor, n // 10, n // 5) for i in range(n)]
            else:   # to `factor` x where it started (a divergence ends above its start)
                up = factor * SHAPES["decay"](0, n) / SHAPES["decay"](n // 3, n)
                shape = [hump(i, n // 3, max(1, n // 10), up, None, 0) for i in range(n)]
            eps = noise(rng, n, sigma, 0)
            verdict = judged([SHAPES["decay"](i, n) * s * math.exp(e) for i, (s, e) in enumerate(zip(shape, eps))], lr)
            total["runs"] += 1
            if verdict:
                total[verdict] += 1
                found += 1
        total["by factor"][factor] = total["by factor"].get(factor, 0) + found
        if found < runs / 2:
            missed.append(f"n={n} sigma={sigma} x{factor}" + (f" warm-up {warm:.0%}" if came_back else "")
                          + f": {found}/{runs}")
    return total, missed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=40, help="runs per cell")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    counts = healthy(rng, args.runs)
    for corr in CORRELATION:
        cells = [counts[corr, s] for s in SIGMAS]
        runs, errors, warnings = (sum(c[k] for c in cells) for k in ("runs", "error", "warning"))
        print(f"healthy, noise {corr}: {errors} errors, {warnings} warnings in {runs} runs (by sigma "
              + ", ".join(f"{s}: {c['error']}/{c['warning']}" for s, c in zip(SIGMAS, cells)) + ")")
    for name, came_back in (("held to the end", False), ("came back during warm-up", True)):
        total, missed = climbs(rng, args.runs, came_back)
        print(f"climbs {name}: {total['error']} errors, {total['warning']} warnings, "
              f"{total['runs'] - total['error'] - total['warning']} missed of {total['runs']} (found by factor "
              + ", ".join(f"x{k}: {v}" for k, v in total["by factor"].items()) + ")")
        for line in missed:
            print(f"  mostly missed: {line}")


if __name__ == "__main__":
    main()
