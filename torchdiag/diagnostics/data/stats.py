"""Streaming statistics of one field of one split: memory bounded by a batch (plus one hash per sample and
fixed-size reservoirs), whatever the data set's size."""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Any

import torch

from ...pictures import layout

RESERVOIR = 4096          # values kept per channel for the histograms
MAX_FEATURES = 4096       # per-feature statistics for 1-D samples up to this width
MAX_CLASSES = 100_000     # distinct label values counted

SEGMENTS = 2   # value changes along a row, at most, of a field of positions (a mask, segment ids): findings.py


@dataclass
class FieldStats:
    name: str
    role: str                                  # input | target | other
    count: int = 0
    dtypes: dict[str, int] = field(default_factory=dict)
    first_shape: tuple | None = None
    other_shape: tuple | None = None           # the first per-sample shape that differs
    other_at: int | None = None                # its sample index
    ragged_at: int | None = None               # in a batch that could not be stacked: the sample that differs
    ragged_shape: tuple | None = None
    ragged_ref: tuple | None = None
    non_finite: int = 0                        # samples holding a NaN/Inf
    first_non_finite: int | None = None
    lo: float = float("inf")
    hi: float = float("-inf")
    mu: float = 0.0                            # mean and sum of squared deviations (Chan's merge)
    m2: float = 0.0
    values: int = 0
    integral: bool = True                      # every value an integer so far
    layout: str | None = None
    ch_mu: Any = None                          # per channel: mean, sum of squared deviations
    ch_m2: Any = None
    ch_n: int = 0
    reservoir: list = field(default_factory=list)   # per channel: values kept for the histograms
    f_lo: Any = None                           # per feature (1-D samples): min and max
    f_hi: Any = None
    row_changes: int = 0                       # 1-D samples: the most value changes along one row so far (a
                                               # padded mask's 1, a sentence pair's segment ids' 2)
    classes: dict[int, int] | None = None      # label value -> count (integral targets; a one-hot target's argmax)
    columns: Any = None                        # a 0/1 (N, C) target: each column's count of ones
    column_rows: int = 0                       # ... over this many samples (of the first shape)
    one_hot: bool = True                       # ... and every row so far held exactly one 1
    binary: bool = True                        # ... while every value so far was 0 or 1
    int_columns: bool = False                  # ... an integer one: token labels unless the model's width says C
    hot: str | None = None                     # an integer one read as "multi" or "one-hot" (settle)
    first_of_class: dict[int, int] = field(default_factory=dict)
    drawn: dict[int, float] | None = None     # label -> the sampler's weight over its samples (a weighted loader)
    seen: int = 0

    def update(self, t: torch.Tensor, indices: list[int]) -> None:
        t = t.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        if t.dim() == 0:
            t = t.reshape(1)
        n = t.shape[0]
        self.count += n
        key = str(t.dtype).replace("torch.", "")
        self.dtypes[key] = self.dtypes.get(key, 0) + n
        sample = tuple(t.shape[1:])
        if self.first_shape is None:
            self.first_shape = sample
            self.layout = layout(sample)
        elif sample != self.first_shape and self.other_shape is None:
            self.other_shape, self.other_at = sample, indices[0]
        if t.is_complex() or t.numel() == 0:
            return
        floating = t.is_floating_point() or t.dtype == torch.bool   # a bool (N, C) target is multi-label, not tokens
        if t.dtype == torch.bool:   # a mask, a multi-label target: its values are 0 and 1
            t = t.to(torch.uint8)
        # float32 work (float64 kept), float64 sums of centred values: no full float64 copy of an image batch;
        # 32/64-bit integers (ids, hashed labels) in float64, exact to 2^53 (float32 made 10**15 999999986991104)
        wide = (torch.float32, torch.float64) if t.is_floating_point() else (torch.int32, torch.int64)
        x = t if t.dtype in (torch.float32, torch.float64) else t.to(torch.float64 if t.dtype in wide else torch.float32)
        finite = torch.isfinite(x) if x.is_floating_point() else None
        if finite is not None and not bool(finite.all()):
            bad = ~finite.reshape(n, -1).all(dim=1)
            self.non_finite += int(bad.sum())
            if self.first_non_finite is None:
                self.first_non_finite = indices[int(bad.nonzero()[0, 0])]
            vals = x[finite]
            x = torch.where(finite, x, torch.zeros((), dtype=x.dtype))
        else:
            vals = x.reshape(-1)
        by_channel = sample == self.first_shape and self.layout is not None and vals.numel() == x.numel()
        if vals.numel():
            lo, hi = torch.aminmax(vals)
            self.lo, self.hi = min(self.lo, float(lo)), max(self.hi, float(hi))
            if not by_channel:   # with channels, the overall figures are merged from theirs (one pass less)
                mean = vals.sum(dtype=torch.float64) / vals.numel()
                m2 = ((vals - mean.to(vals.dtype)) ** 2).sum(dtype=torch.float64)
                self.values, self.mu, self.m2 = merge(self.values, self.mu, self.m2, vals.numel(), float(mean), float(m2))
            if self.integral and t.is_floating_point():
                self.integral = bool((vals == vals.round()).all())
        if sample == self.first_shape:
            merged = self._channels(x, sample)
            if by_channel and merged is not None:
                self.values, self.mu, self.m2 = merge(self.values, self.mu, self.m2, *merged)
            self._features(x, sample)
        # class labels: one integral value per sample, or integer tensors (masks, token labels); a float
        # (N, C) target is one-hot / multi-label / soft, not C class indices
        if self.role == "target" and self.integral and (not floating or sample in ((), (1,))):
            self._labels(t, indices)
        if self.role == "target" and len(sample) == 1 and sample == self.first_shape:
            self._columns(x, indices, floating)

    def _columns(self, x, indices, floating: bool) -> None:
        """A (N, C) target of 0s and 1s: each column's count of ones (a multi-label target's positives per label).
        A float or bool one whose rows all hold exactly one 1 is one-hot: its argmax is the class. An integer one
        (sklearn's MultiLabelBinarizer) is token labels or C labels: settle decides by the model's width."""
        if not self.binary or not 2 <= x.shape[1] <= MAX_FEATURES:
            return
        if not bool(((x == 0) | (x == 1)).all()):   # soft labels, smoothed, or values: no columns of labels
            self.binary, self.one_hot, self.columns = False, False, None
            if floating:
                self.classes, self.first_of_class = None, {}
            return
        self.int_columns = not floating
        ones = x.sum(0, dtype=torch.float64)
        self.columns = ones if self.columns is None else self.columns + ones
        self.column_rows += x.shape[0]
        if self.one_hot and bool((x.sum(1) == 1).all()):
            if floating:
                self._labels(x.argmax(1), indices)
        elif self.one_hot:   # a row with none or several: multi-label; the argmax counts so far meant nothing
            self.one_hot = False
            if floating:
                self.classes, self.first_of_class = None, {}

    def _channels(self, x, sample):
        """Per-channel merge; returns this batch's overall (count, mean, M2) merged from its channels."""
        if self.layout is None:
            return None
        per = x.movedim(-1, 1) if self.layout == "hwc" else x.unsqueeze(1) if self.layout == "hw" else x
        per = per.reshape(per.shape[0], per.shape[1], -1)
        nb = per.shape[0] * per.shape[2]
        mean = per.sum(dim=(0, 2), dtype=torch.float64) / nb
        m2 = ((per - mean.to(per.dtype).view(1, -1, 1)) ** 2).sum(dim=(0, 2), dtype=torch.float64)
        if self.ch_mu is None:
            self.ch_n, self.ch_mu, self.ch_m2 = nb, mean, m2
        else:
            self.ch_n, self.ch_mu, self.ch_m2 = merge(self.ch_n, self.ch_mu, self.ch_m2, nb, mean, m2)
        self.seen += 1
        flat = per.transpose(0, 1).reshape(per.shape[1], -1)
        g = torch.Generator().manual_seed(self.seen)
        take = torch.randint(0, flat.shape[1], (min(256, flat.shape[1]),), generator=g)
        if not self.reservoir:
            self.reservoir = [[] for _ in range(flat.shape[0])]
        for c in range(flat.shape[0]):
            if len(self.reservoir[c]) < RESERVOIR:
                self.reservoir[c].extend(flat[c, take].tolist())
        total = (0, 0.0, 0.0)
        for c in range(mean.shape[0]):
            total = merge(*total, nb, float(mean[c]), float(m2[c]))
        return total

    def _features(self, x, sample) -> None:
        if self.layout is not None or len(sample) != 1 or sample[0] > MAX_FEATURES or self.role == "target":
            return
        lo, hi = x.min(dim=0).values, x.max(dim=0).values
        self.f_lo = lo if self.f_lo is None else torch.minimum(self.f_lo, lo)
        self.f_hi = hi if self.f_hi is None else torch.maximum(self.f_hi, hi)
        if self.row_changes <= SEGMENTS and x.shape[-1] > 1 and not x.is_complex():
            changes = (x[:, 1:] != x[:, :-1]).sum(1)
            self.row_changes = max(self.row_changes, int(changes.max()) if changes.numel() else 0)

    def drawn_by(self, t, weights) -> None:
        """A loader that samples by weight draws a class in proportion to its samples' summed weights."""
        if t.dim() != 1 or t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
            return
        self.drawn = self.drawn if self.drawn is not None else {}
        values, inverse = torch.unique(t.cpu().to(torch.int64), return_inverse=True)
        sums = torch.zeros(len(values), dtype=torch.float64).index_add_(0, inverse, weights)
        for v, w in zip(values.tolist(), sums.tolist()):
            self.drawn[v] = self.drawn.get(v, 0.0) + w

    def _labels(self, t, indices) -> None:
        if self.classes is None:
            self.classes = {}
        if len(self.classes) > MAX_CLASSES:
            return
        flat = t.reshape(t.shape[0], -1)
        if flat.is_floating_point():   # a NaN label is no class (int64 would make it -2^63); `non-finite` names it
            keep = torch.isfinite(flat).all(dim=1)
            if not bool(keep.all()):
                flat, indices = flat[keep], [i for i, k in zip(indices, keep.tolist()) if k]
        values, counts = torch.unique(flat.to(torch.int64), return_counts=True)
        for v, c in zip(values.tolist(), counts.tolist()):
            self.classes[v] = self.classes.get(v, 0) + c
        if flat.shape[1] == 1 and flat.shape[0] == len(indices):   # (a collate's list of samples: rows are not samples)
            column = flat[:, 0].to(torch.int64)
            for v in values.tolist():
                if v not in self.first_of_class:
                    self.first_of_class[v] = indices[int((column == v).nonzero()[0, 0])]

    # ---- read-outs ----------------------------------------------------------------------------------

    @property
    def mean(self) -> float | None:
        return self.mu if self.values else None

    @property
    def std(self) -> float | None:
        return max(self.m2, 0.0) ** 0.5 / self.values ** 0.5 if self.values else None

    @property
    def multi_label(self) -> bool:
        """A (N, C) target of 0s and 1s whose rows are not all one-hot: C labels, each present or not. Not where
        the labels never 1 are a run of two or more at the row's end: positions past every sequence's length, as
        padding makes them (per-position labels padded to a fixed length: a review), unless the model's C outputs
        say they are labels (settle); nor an integer one that settle did not read as C labels."""
        if self.hot == "multi":
            return True
        if self.columns is None or self.one_hot or self.int_columns:
            return False
        return not self.never_tail()

    def never_tail(self) -> list[int]:
        """The labels never 1 that run to the row's last, two or more (padding past every sequence's length, or
        labels unused); [] otherwise."""
        counts = self.columns.tolist() if self.columns is not None else []
        run = []
        for c in range(len(counts) - 1, -1, -1):
            if counts[c]:
                break
            run.append(c)
        return run[::-1] if len(run) >= 2 else []

    def positives(self) -> dict[int, int]:
        """Samples per label (a column's ones) of a multi-label target, or per class of a one-hot integer one."""
        return dict(enumerate(int(v) for v in self.columns.tolist())) if self.columns is not None else {}

    def settle(self, width: int | None) -> None:
        """A (N, C) 0/1 target beside a model of C outputs is C labels (multi-hot), or C classes where every row is
        one-hot: an integer one's per-element counts {0, 1} were a false imbalance and C - 2 classes "absent" (a
        review); a float one's unused last labels are labels, not padding (a second review)."""
        if self.columns is None or width != self.columns.numel():
            return
        if not self.int_columns:
            self.hot = None if self.one_hot else "multi"
            return
        if self.one_hot:
            self.hot, self.first_of_class = "one-hot", {}
            self.classes = {c: n for c, n in self.positives().items() if n}   # (the classes seen, as _labels counts)
        else:
            self.hot, self.classes = "multi", None

    @property
    def constant(self) -> bool:
        return bool(self.values) and self.lo == self.hi

    def channel_stats(self) -> tuple[list[float], list[float]] | None:
        if self.ch_mu is None or not self.ch_n:
            return None
        return [float(a) for a in self.ch_mu], [float(a) for a in (self.ch_m2 / self.ch_n).sqrt()]

    def constant_features(self) -> tuple[list[int], int]:
        """(indices of features that never vary, feature count) for 1-D samples."""
        if self.f_lo is None:
            return [], 0
        same = (self.f_hi - self.f_lo) <= 0
        return same.nonzero().flatten().tolist(), int(same.numel())

    def summary(self) -> dict:
        ch = self.channel_stats()
        d = {"field": self.name, "role": self.role, "samples": self.count,
             "dtype": ",".join(self.dtypes), "shape": "x".join(map(str, self.first_shape or ())) or "scalar",
             "min": None if self.lo == float("inf") else self.lo, "max": None if self.hi == float("-inf") else self.hi,
             "mean": self.mean, "std": self.std, "non_finite_samples": self.non_finite,
             "first_non_finite": self.first_non_finite, "other_shape": list(self.other_shape) if self.other_shape is not None else None,
             "other_shape_at": self.other_at, "ragged_at": self.ragged_at}
        if ch is not None:
            d.update(channel_mean=ch[0], channel_std=ch[1], layout=self.layout)
        return d


def merge(na, ma, m2a, nb, mb, m2b):
    """Chan et al.'s pairwise merge of (count, mean, sum of squared deviations): scalars or tensors."""
    if not na:
        return nb, mb, m2b
    n = na + nb
    delta = mb - ma
    return n, ma + delta * (nb / n), m2a + m2b + delta * delta * (na * nb / n)


def padding_mask(tensors: list[torch.Tensor]):
    """The attention mask of a padded batch among its input fields: N×L, 0/1, each row's ones a run at one end
    (right or left padding) with at least one 1, and another field of that N×L to cut. A sweep:
    the same sentence hashed apart in batches padded to other lengths, and 42 of 50 copies across splits were
    found. token_type_ids (all 0, or a run in the middle) are no mask."""
    for m in tensors:
        if m.dim() != 2 or m.is_floating_point() or m.is_complex() or m.numel() == 0:
            continue
        if not any(t is not m and t.dim() >= 2 and t.shape[:2] == m.shape for t in tensors):
            continue
        b = m.detach().cpu()
        if b.dtype != torch.bool and not bool(((b == 0) | (b == 1)).all()):
            continue
        b = b.bool()
        ones = b.sum(1)
        if not bool((ones > 0).all()):   # all ones (a batch of one, or of equal lengths) cuts nothing: still the mask
            continue
        right = (b.cumsum(1) == torch.arange(1, b.shape[1] + 1)).sum(1) == ones   # ones first, then zeros
        left = b.flip(1).cumsum(1).eq(torch.arange(1, b.shape[1] + 1)).sum(1) == ones
        if bool((right | left).all()):
            return m
    return None


class Hashes:
    """One 8-byte content hash per sample (input fields only: shape, dtype and bytes): exact duplicates."""

    def __init__(self):
        self.first: dict[bytes, int] = {}
        self.duplicates = 0
        self.pairs: list[tuple[int, int]] = []

    @staticmethod
    def digests(tensors: list[torch.Tensor]) -> list[bytes]:
        n = tensors[0].shape[0] if tensors[0].dim() else 1
        mask = padding_mask(tensors)
        parts = [t.detach().cpu().contiguous().reshape(n, -1) for t in tensors]
        # a padded field's length is its batch's: hashed without it, its padding cut by the mask
        padded = [mask is not None and t is not mask and t.shape[:2] == mask.shape for t in tensors]
        heads = [(str(t.dtype) + "|" + (f"padded{tuple(t.shape[2:])}" if p else str(tuple(t.shape[1:])))).encode()
                 for t, p in zip(tensors, padded)]
        arrays = [t.view(torch.uint8) if t.dtype == torch.bfloat16 else t for t in parts]
        arrays = [a.numpy() for a in arrays]
        keep = mask.cpu().bool().numpy() if mask is not None else None
        out = []
        for j in range(n):   # SHA-256 (hardware-assisted on x86/ARM: faster here than blake2b), 8 bytes kept
            h = hashlib.sha256()
            for head, a, t, p in zip(heads, arrays, tensors, padded):
                if t is mask:
                    continue   # what it says is in the cut fields (its length is its batch's)
                h.update(head)
                h.update((a[j].reshape(t.shape[1:])[keep[j]] if p else a[j]).tobytes())
            out.append(h.digest()[:8])
        return out

    def add(self, digests: list[bytes], indices: list[int]) -> None:
        for d, i in zip(digests, indices):
            j = self.first.setdefault(d, i)
            if j != i:
                self.duplicates += 1
                if len(self.pairs) < 20:
                    self.pairs.append((j, i))


SPACE_COLUMNS = 256    # input columns of a sample, at most, whose values Space keeps (a wider one: not read)
SPACE_VALUES = 1024    # distinct values a column may take before the inputs are no small discrete space
SPACE_MAX = 2.0 ** 32  # inputs a space may hold: beyond, no data set read here has every one


class Space:
    """Do the inputs enumerate a discrete space: every combination of their columns' values present? Kept per
    column: its distinct values (up to SPACE_VALUES) and a hash of its values sample after sample, which finds the
    columns that copy another (a board's wrap-around padding). `size()` is the space's size when the distinct
    samples number exactly the product of the distinct columns' value counts, else None. Where it holds, repeats
    and a split's overlap are the data's own (a sweep of the ported training-bug programs: Game of Life's 512
    3×3 boards drawn 8,000 times, XOR's 4 points), no leak: no other input exists."""

    MUL = 0x9E3779B97F4A7C15   # a 64-bit odd multiplier: column hashes as polynomials in it, wrapping

    def __init__(self):
        self.values: list[set] | None = None   # per column; None before the first batch
        self.sig = None                         # per column: uint64 hash of its values so far
        self.gone = False                       # too wide, ragged or too many values: not a small space

    def add(self, tensors: list[torch.Tensor]) -> None:
        import numpy as np

        if self.gone or not tensors:
            return
        n = tensors[0].shape[0]
        try:
            x = torch.cat([t.detach().cpu().reshape(n, -1).to(torch.float64) for t in tensors], 1).numpy()
        except (RuntimeError, TypeError):   # ragged, complex, or not numbers
            self.gone = True
            return
        if x.shape[1] > SPACE_COLUMNS or (self.values is not None and x.shape[1] != len(self.values)):
            self.gone = True
            return
        if self.values is None:
            self.values = [set() for _ in range(x.shape[1])]
            self.sig = np.zeros(x.shape[1], dtype=np.uint64)
        for j, col in enumerate(x.T):
            self.values[j].update(np.unique(col).tolist())
            if len(self.values[j]) > SPACE_VALUES:
                self.gone = True
                return
        bits = np.ascontiguousarray(x + 0.0).view(np.uint64)   # (+ 0.0: -0.0 is 0.0)
        powers = np.power(np.uint64(self.MUL), np.arange(n, 0, -1, dtype=np.uint64) - np.uint64(1))
        with np.errstate(over="ignore"):
            self.sig = self.sig * np.power(np.uint64(self.MUL), np.uint64(n)) + (bits * powers[:, None]).sum(0)
        # columns that differ now differ for good, and value counts only grow: past SPACE_MAX no data set read here
        # enumerates the space (a review: 200 columns of 10 values kept every batch, `data` 2.4x slower)
        if self._least() > SPACE_MAX:
            self.gone = True

    def _counts(self) -> list[int]:
        """The value counts of the columns that vary, each column that copies another (so far) counted once."""
        first: dict[int, int] = {}
        for sig, vals in zip(self.sig.tolist(), self.values):
            if len(vals) > 1:
                first.setdefault(sig, len(vals))
        return list(first.values())

    def _least(self) -> float:
        """The product of the value counts over the columns that differ so far: what the space holds at least."""
        return math.prod(float(k) for k in self._counts())

    def size(self, distinct: int, samples: int) -> int | None:
        """The space's size where the `distinct` samples (of `samples`) are every combination of the distinct
        columns' values and each column takes at most √samples values; else None."""
        if self.gone or self.values is None or distinct < 2:
            return None
        counts = self._counts()
        if any(k * k > samples for k in counts) or self._least() != distinct:
            return None
        return distinct
