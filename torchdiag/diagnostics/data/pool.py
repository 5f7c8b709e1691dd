"""Whether validation inputs that are also training inputs can be chance (issue 32): iris measured to 0.1 cm has two
flowers alike, pairs of integers in 0..100 repeat by the thousand, yet exact copies of a continuous row are a leak.

Chance needs positive evidence of a small input space, measured per feature on the distinct rows of both splits
(copies cannot vouch for themselves): the chance that two draws agree on a feature, estimated without bias from the
equal pairs among distinct rows, multiplied over features (independence). A feature with no value repeated gives 0:
any overlap is then a leak, as before. Two draws from data whose duplicates are a bug (a CSV written twice) and a
pool of few values cannot otherwise be told apart; both withdrawn rules (Good-Turing on the repeats, a chi-square
of each repeated input's split) read the copies as the pool.

The product can overstate the chance where features depend on each other against independence (one-hot columns of
one category): it is capped by what the repeats inside each split allow (an upper bound from the equal pairs
within train and within val, which a leak across the splits does not add to)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

MAX_FEATURES = 64          # wider inputs (images, sequences) are not a pool: two exact draws alike are copies
MAX_VALUES = 1024          # a feature with more distinct values is taken as continuous (no chance of equality)
LEAK_P = 1e-3              # an overlap this unlikely by chance is a leak, with the chance taken ...
SLACK = 1.1                # ... this much higher: the estimate runs a few % low even on uniform values


class Pool:
    """Per-feature value counts over the distinct input rows of both splits."""

    def __init__(self):
        self.counts: list[dict[float, int]] | None = None
        self.rows = 0
        self.off = False   # wide, non-real or non-finite inputs, or a feature with too many values: no pool

    def add(self, tensors: list[torch.Tensor], keep: list[int]) -> None:
        """The rows at positions `keep` of this batch, inputs first seen now."""
        if self.off or not keep:
            return
        n = tensors[0].shape[0]
        try:
            rows = torch.cat([t.detach().cpu().reshape(n, -1).to(torch.float64) for t in tensors], 1)[keep]
        except (RuntimeError, TypeError):   # complex, quantized, ...
            self.off = True
            return
        if rows.shape[1] > MAX_FEATURES or not bool(torch.isfinite(rows).all()):
            self.off = True
            return
        if self.counts is None:
            self.counts = [{} for _ in range(rows.shape[1])]
        if len(self.counts) != rows.shape[1]:
            self.off = True
            return
        for column, counts in zip(rows.T.numpy(), self.counts):
            values, k = np.unique(column, return_counts=True)
            for v, m in zip(values.tolist(), k.tolist()):
                counts[v] = counts.get(v, 0) + m
            if len(counts) > MAX_VALUES:
                self.off = True
                return
        self.rows += len(keep)

    def collision(self) -> float:
        """The chance that two draws agree on every feature (0 without evidence of a pool)."""
        if self.off or self.counts is None or self.rows < 2:
            return 0.0
        pairs = self.rows * (self.rows - 1)
        c = 1.0
        for counts in self.counts:
            c *= sum(k * (k - 1) for k in counts.values()) / pairs
        return c


@dataclass
class Chance:
    collision: float      # two draws alike, as used (after the cap)
    expected: float       # validation samples that meet a training twin by chance
    p: float              # the chance of this many or more, at SLACK times the collision chance

    @property
    def leak(self) -> bool:
        return self.p <= LEAK_P


def chance(pool: Pool, train, val, overlap: int) -> Chance:
    """`train`, `val`: the splits' Hashes. Each validation sample meets one of the n training draws with probability
    1 - (1 - c)^n; the overlap's tail under Binomial(validation samples, that) says leak or chance."""
    n_t, n_v = train.seen, val.seen
    c = min(pool.collision(), _within_bound(train, val))
    return Chance(c, n_v * _meets(c, n_t), _tail(n_v, _meets(SLACK * c, n_t), overlap))


def _meets(c: float, n: int) -> float:
    """The chance that one draw meets one of n others, two alike with chance c."""
    return -math.expm1(n * math.log1p(-c)) if c < 1 else 1.0


def _within_bound(train, val) -> float:
    """An upper bound (about 99.9%) on the collision chance from the equal pairs inside each split: Poisson."""
    pairs = train.seen * (train.seen - 1) / 2 + val.seen * (val.seen - 1) / 2
    w = train.pairs_within + val.pairs_within
    return min(1.0, (w + 1 + 3.1 * math.sqrt(w + 1)) / pairs) if pairs else 1.0


def _tail(n: int, q: float, k: int) -> float:
    """P(Binomial(n, q) >= k), summed from k up (k at or below the mean: 1)."""
    if k <= 0 or k <= n * q:
        return 1.0
    if q <= 0:
        return 0.0
    if q >= 1:
        return 1.0
    log_term = (math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)
                + k * math.log(q) + (n - k) * math.log1p(-q))
    term, total = math.exp(log_term), 0.0
    for j in range(k, n + 1):
        total += term
        if term < total * 1e-12:
            break
        term *= (n - j) / (j + 1) * q / (1 - q)
    return min(1.0, total)
