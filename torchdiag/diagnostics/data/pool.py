"""Do the training and validation splits share inputs the way independent draws from one source do?

Inputs from a small pool (the 512 positions of a 3x3 board, rounded measurements, a few categorical columns) repeat
within a split and across splits by chance; a leak (validation samples copied from training) or a split written
twice shares them in a pattern chance does not give. Given how often each input occurs in both splits together (c),
independent draws put each copy in the validation split with probability q = val / (train + val), so the number of
its copies that land there is Binomial(c, q). Pearson's chi-square compares the inputs' observed splits with that,
over the inputs that occur more than once (an input seen once cannot be shared), with cells of expected count below
MIN_EXPECTED merged. Too few repeated inputs to test (no degree of freedom) is no evidence of a pool.
"""
from __future__ import annotations

import math

MIN_EXPECTED = 5.0   # Pearson's usual floor for a cell
P_LEAK = 1e-3        # the chance level below which the sharing is not what independent draws give


def shared_by_chance(train, val, n_train: int, n_val: int) -> float | None:
    """The chi-square test's p-value (core of train-val-overlap's info), or None when it cannot be taken.
    `train`, `val`: stats.Hashes of the two splits."""
    if not n_train or not n_val:
        return None
    q = n_val / (n_train + n_val)
    splits: dict[int, dict[int, int]] = {}   # copies c -> {copies in val k: inputs}
    for d in set(train.repeats) | set(val.repeats) | {d for d in val.first if d in train.first}:
        k = val.count(d)
        c = train.count(d) + k
        row = splits.setdefault(c, {})
        row[k] = row.get(k, 0) + 1
    chi2, df = 0.0, 0
    for c, row in splits.items():
        n = sum(row.values())
        cells = _merged([(n * _binomial(c, k, q), row.get(k, 0)) for k in range(c + 1)])
        chi2 += sum((o - e) ** 2 / e for e, o in cells)
        df += len(cells) - 1
    return _upper_tail(chi2, df) if df else None


def _binomial(c: int, k: int, q: float) -> float:
    """P(k of c copies in the validation split), in logs: c reaches thousands for an input repeated that often."""
    return math.exp(math.lgamma(c + 1) - math.lgamma(k + 1) - math.lgamma(c - k + 1)
                    + k * math.log(q) + (c - k) * math.log1p(-q))


def _merged(cells: list[tuple[float, int]]) -> list[tuple[float, int]]:
    """Adjacent cells pooled until each expects at least MIN_EXPECTED (the last pooled into its neighbour)."""
    out: list[tuple[float, int]] = []
    e_acc, o_acc = 0.0, 0
    for e, o in cells:
        e_acc, o_acc = e_acc + e, o_acc + o
        if e_acc >= MIN_EXPECTED:
            out.append((e_acc, o_acc))
            e_acc, o_acc = 0.0, 0
    if out and (e_acc or o_acc):
        e, o = out.pop()
        out.append((e + e_acc, o + o_acc))
    elif not out and (e_acc or o_acc):
        out.append((e_acc, o_acc))
    return out


def _upper_tail(x: float, df: int) -> float:
    """P(chi-square with df degrees of freedom ≥ x), by Wilson and Hilferty's cube-root normal approximation."""
    h = 2.0 / (9.0 * df)
    z = ((x / df) ** (1.0 / 3.0) - (1.0 - h)) / math.sqrt(h)
    return 0.5 * math.erfc(z / math.sqrt(2.0))
