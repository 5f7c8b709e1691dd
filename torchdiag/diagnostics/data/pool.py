"""Whether validation inputs that are also training inputs can be chance (issue 32): pairs of integers in 0..100
repeat by the thousand and counts of a few words repeat by the dozen, yet exact copies of a continuous row are a
leak. Chance is accepted only on positive evidence from two sides, since copies must not vouch for themselves:

- the inputs are discrete: every feature repeats its values among the *distinct* rows of both splits (the chance
  that two draws agree on it, estimated without bias from those rows, is above 0), with at most 1,024 values and
  64 features. A continuous feature never repeats among distinct rows, so its rows' copies are a leak as before;
- the draws do repeat: equal pairs inside each split, whose rate estimates the chance that two draws are alike (a
  leak across the splits adds none; none inside either split is no evidence, and the overlap a leak).

The features only gate: their product (independence) is off by orders of magnitude where features depend on each
other, too low for correlated measurements or padding, too high for one-hot columns (a review). A file written
twice makes pairs inside the splits; it is told by its singletons: draws from any source leave at least
N(1 - c)^(N-1) inputs seen once (Jensen: uniform is the least), a doubled file almost none. Two withdrawn rules read
the copies as the pool (Good-Turing on the repeats, a chi-square of each repeated input's split); a review of a third
broke the product capped by an upper bound from no pairs at all (4 + 3·√4 copies passed) and one-hot rows written
twice."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

MAX_FEATURES = 64          # wider inputs (images, sequences) are not a pool: two exact draws alike are copies
MAX_VALUES = 1024          # a feature with more distinct values is taken as continuous (no chance of equality)
LEAK_P = 1e-3              # an overlap this unlikely by chance is a leak, with the chance taken ...
SLACK = 1.1                # ... this much higher: the estimates run a few % low even on uniform values
CHUNK = 65_536             # distinct rows counted at once (numpy, not a Python loop per value)


class Pool:
    """Per-feature value counts over the distinct input rows of both splits."""

    def __init__(self):
        self.counts: list[dict[float, int]] | None = None
        self.rows = 0
        self.off = False   # wide or non-real inputs, a feature with too many values: no pool
        self._waiting: list[np.ndarray] = []
        self._waiting_rows = 0

    def add(self, tensors: list[torch.Tensor], keep: list[int]) -> None:
        """The rows at positions `keep` of this batch, inputs first seen now (non-finite rows left out)."""
        if self.off or not keep:
            return
        n = tensors[0].shape[0]
        if any(t.is_complex() or t.is_quantized or not (t.is_floating_point() or _integral(t)) for t in tensors):
            self.off = True
            return
        rows = torch.cat([t.detach().cpu().reshape(n, -1).to(torch.float64) for t in tensors], 1)[keep]
        if rows.shape[1] > MAX_FEATURES or (self.counts is not None and len(self.counts) != rows.shape[1]):
            self.off = True
            return
        rows = rows[torch.isfinite(rows).all(1)]
        if self.counts is None:
            self.counts = [{} for _ in range(rows.shape[1])]
        self._waiting.append(rows.numpy())
        self._waiting_rows += len(rows)
        if self._waiting_rows >= CHUNK:
            self._count()

    def _count(self) -> None:
        rows = np.concatenate(self._waiting) if self._waiting else None
        self._waiting, self._waiting_rows = [], 0
        if rows is None or self.off or self.counts is None:
            return
        for column, counts in zip(rows.T, self.counts):
            values, k = np.unique(column, return_counts=True)
            for v, m in zip(values.tolist(), k.tolist()):
                counts[v] = counts.get(v, 0) + m
            if len(counts) > MAX_VALUES:
                self.off = True
                self.counts = None
                return
        self.rows += len(rows)

    def collision(self) -> float:
        """The chance that two draws agree on every feature, if features were independent (0: one never repeats)."""
        self._count()
        if self.off or self.counts is None or self.rows < 2:
            return 0.0
        pairs = self.rows * (self.rows - 1)
        c = 1.0
        for counts in self.counts:
            c *= sum(k * (k - 1) for k in counts.values()) / pairs
        return c


def _integral(t: torch.Tensor) -> bool:
    return t.dtype in (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


@dataclass
class Chance:
    collision: float      # two draws alike, from the repeats inside the splits (0 without evidence of a pool)
    expected: float       # validation samples that meet a training twin by chance
    p: float              # the chance of this many or more, at SLACK times the collision chance
    features: float       # the features' product (0: a continuous or wide feature, no pool)
    within: float         # equal pairs inside the splits over all pairs inside them
    copies: bool          # too few singletons for draws: copies inside the splits (a file written twice)

    @property
    def leak(self) -> bool:
        return self.p <= LEAK_P


def chance(pool: Pool, train, val, overlap: int) -> Chance:
    """`train`, `val`: the splits' Hashes. Each validation sample meets one of the n training draws with probability
    1 - (1 - c)^n; the overlap's tail under Binomial(validation samples, that) says leak or chance."""
    n_t, n_v = train.seen, val.seen
    inside = n_t * (n_t - 1) / 2 + n_v * (n_v - 1) / 2
    within = (train.pairs_within + val.pairs_within) / inside if inside else 0.0
    features = pool.collision()
    copies = _copies(train, val)
    c = within if features > 0 and not copies else 0.0
    return Chance(c, n_v * _meets(c, n_t), _tail(n_v, _meets(SLACK * c, n_t), overlap), features, within, copies)


def _copies(train, val) -> bool:
    """Too few inputs seen once in both splits for independent draws: half what the least (uniform) source leaves,
    at the pair rate of both splits together."""
    n = train.seen + val.seen
    pairs = n * (n - 1) / 2
    c = (train.pairs_within + val.pairs_within + _cross_pairs(train, val)) / pairs if pairs else 0.0
    least = n * _stays(c, n - 1)
    return least >= 10 and _singletons(train, val) < least / 2


def _cross_pairs(train, val) -> int:
    shared = val.first.keys() & train.first.keys()
    return sum((1 + train.copies.get(d, 0)) * (1 + val.copies.get(d, 0)) for d in shared)


def _singletons(train, val) -> int:
    once = sum(1 for d in train.first if d not in train.copies and d not in val.first)
    return once + sum(1 for d in val.first if d not in val.copies and d not in train.first)


def _stays(c: float, n: int) -> float:
    """(1 - c)^n: a draw meets none of n others."""
    return math.exp(n * math.log1p(-c)) if c < 1 else 0.0


def _meets(c: float, n: int) -> float:
    """The chance that one draw meets one of n others, two alike with chance c."""
    return -math.expm1(n * math.log1p(-c)) if c < 1 else 1.0


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
