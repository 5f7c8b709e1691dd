"""One streaming pass over a split: every field's statistics, one content hash per sample, a few sample
inputs per class for the picture grid. A map-style dataset is read in index order (a seeded random subset
of --samples when it is larger), so every finding names the dataset index; other iterables by position."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from ...core import batches as B
from ...core.datasets import settings
from ...core.fetch import guarded
from .stats import FieldStats, Hashes, Space, layout

ITERABLE_BATCHES = 100      # an iterable without --samples: at most this many batches


class Ragged:
    """A batch whose samples the collate function could not stack (their shapes differ): each sample
    collated on its own."""

    def __init__(self, parts: list):
        self.parts = parts


class SafeCollate:
    """The loader's collate_fn; when it fails on samples whose shapes differ, a Ragged batch instead
    (so different shapes are a finding naming the samples, not a crash). Top-level: workers pickle it."""

    def __init__(self, collate):
        self.collate = collate

    def __call__(self, samples):
        try:
            return self.collate(samples)
        except Exception:
            if not isinstance(samples, list) or len(samples) < 2 or not _shapes_differ(samples):
                raise
            return Ragged([self.collate([s]) for s in samples])


def _shapes_differ(samples) -> bool:
    def shapes(s):
        return [tuple(getattr(t, "shape", ())) for _, t in B.flatten(s)]

    first = shapes(samples[0])
    return any(shapes(s) != first for s in samples[1:])


def safe(loader) -> dict:
    """rebuild() changes that make a DataLoader's collate_fn SafeCollate (automatic batching only)."""
    if loader.batch_sampler is None or isinstance(loader.collate_fn, SafeCollate):
        return {}
    return {"collate_fn": SafeCollate(loader.collate_fn)}


@dataclass
class SplitScan:
    split: str
    roles: Any = None                         # core.batches.Roles
    fields: dict[str, FieldStats] = field(default_factory=dict)
    hashes: Hashes = field(default_factory=Hashes)
    space: Space = field(default_factory=Space)   # do the inputs enumerate a small discrete space?
    samples: int = 0
    total: int | None = None                  # len of the data set, when known
    subset: bool = False                      # a random subset of --samples was read
    batches: int = 0
    seconds: float = 0.0
    gallery: dict[Any, list] = field(default_factory=dict)   # label -> sample inputs (numpy) for the grid
    overlap: int = 0                          # (validation) samples whose hash is in the training split
    overlap_pairs: list = field(default_factory=list)
    by_label: dict = field(default_factory=dict)   # (validation) label -> [samples, of them in the training split]
    done: bool = False
    note: str | None = None
    weights: Any = None                       # per dataset index: the loader's WeightedRandomSampler's weights
    blank: dict = field(default_factory=dict)  # label (or None) -> samples whose image input is one value throughout
    blank_first: tuple | None = None          # (sample index, that value) of the first


def scan(data, opts, split: str, roles_hint=None, against: SplitScan | None = None, seed: int = 0) -> SplitScan:
    """The pass itself; `against`: the training split, whose hashes the validation samples are looked up in.
    Ctrl-C leaves what was read in the returned-so-far object (the caller holds it through `out`)."""
    out = SplitScan(split)
    scan_into(out, data, opts, roles_hint, against, seed)
    return out


def scan_into(out: SplitScan, data, opts, roles_hint, against, seed: int, positional: int = 1) -> None:
    source, chunks, dataset = _source(out, data, opts, seed)
    # one batch read ahead: loading the next overlaps the checks of this one (nothing is timed here)
    fetcher, cleanup = guarded(source, opts.timeout, dataset=dataset, label=f"{out.split} data", ahead=1)
    limit = None if chunks is not None else (opts.samples or None)
    max_batches = ITERABLE_BATCHES if chunks is None and limit is None else None
    t0 = time.perf_counter()
    pos = 0
    try:
        for k, batch in enumerate(fetcher):
            parts = batch.parts if isinstance(batch, Ragged) else [batch]
            n = sum(B.batch_size(p) for p in parts)
            if chunks is not None and not isinstance(batch, Ragged) and _samples_listed(batch, len(chunks[k])):
                n = len(chunks[k])
            idx = chunks[k] if chunks is not None else list(range(pos, pos + n))
            if out.roles is None:
                out.roles = roles_hint or B.find_roles(parts[0], opts.input_field, opts.target_field, _cli, positional)
            if isinstance(batch, Ragged):
                _mark_ragged(out, parts, idx)
            j = 0
            for p in parts:
                m = B.batch_size(p) if len(parts) > 1 else n
                _feed(out, p, idx[j:j + m], opts, against)
                j += m
            pos += n
            out.samples += n
            out.batches += 1
            if (limit is not None and out.samples >= limit) or (max_batches and out.batches >= max_batches):
                if max_batches:
                    out.note = f"{out.split}: an iterable of unknown length: read its first {max_batches} batches"
                break
        out.done = True
    finally:
        out.seconds = time.perf_counter() - t0
        fetcher.close()
        cleanup()


def _samples_listed(batch, drawn: int) -> bool:
    """A collate that keeps the samples as a list (variable lengths; torchvision's detection collate, tuple(zip(*b))),
    whose first field is one sample, not the batch (a sweep: 5 samples of 20 read; a review: a detection loader's 3
    channels counted as 3 samples): a list or tuple below the top of the batch with as many items as the sampler
    drew, or fields that disagree on their leading size with the drawn count among them. A collate that drops
    samples (every field 6 of 8 drawn) keeps its own count (a review)."""
    sizes = {int(t.shape[0]) for _, t in B.flatten(batch) if t.dim()}
    return (len(sizes) > 1 and drawn in sizes) or _listed(batch, drawn, top=True)


def _listed(obj, drawn: int, top: bool = False) -> bool:
    if isinstance(obj, dict):
        return any(_listed(v, drawn) for v in obj.values())
    if isinstance(obj, (list, tuple)) and not hasattr(obj, "_fields"):
        if not top and len(obj) == drawn and drawn > 1:
            return True
        return any(_listed(v, drawn) for v in obj)
    return False


def _cli(name: str) -> str:
    return "--" + name.replace("_", "-")


def _source(out: SplitScan, data, opts, seed: int):
    """(iterable, index lists per batch or None, dataset for naming failing samples)."""
    from torch.utils.data import DataLoader
    from torch.utils.data._utils.collate import default_collate

    from ...core.datasets import loader_for

    ds = data.dataset
    if ds is None:
        return loader_for(data, opts.batch_size, seed), None, None
    n = len(ds)
    out.total = n
    idx = list(range(n))
    if opts.samples and n > opts.samples:
        g = torch.Generator().manual_seed(seed)
        idx = sorted(torch.randperm(n, generator=g)[: opts.samples].tolist())
        out.subset = True
    loader = data.loader
    sampler = getattr(loader, "sampler", None)
    weights = getattr(sampler, "weights", None)
    # without replacement every sample is drawn once an epoch whatever its weight (a review): the weights say nothing
    if isinstance(weights, torch.Tensor) and weights.dim() == 1 and len(weights) == n \
            and getattr(sampler, "replacement", True):
        out.weights = weights.to(torch.float64)   # read in index order, drawn by weight: the classes training sees
    auto = loader is not None and loader.batch_sampler is not None
    bs = (settings(loader)["batch_size"] if auto else None) or opts.batch_size
    chunks = [idx[i:i + bs] for i in range(0, len(idx), bs)]
    collate = loader.collate_fn if auto else default_collate
    kw = {}
    if loader is not None and loader.num_workers > 0:
        kw = dict(num_workers=loader.num_workers, worker_init_fn=loader.worker_init_fn,
                  multiprocessing_context=loader.multiprocessing_context)
    return DataLoader(ds, batch_sampler=chunks, collate_fn=SafeCollate(collate), **kw), chunks, ds


def _mark_ragged(out: SplitScan, parts: list, idx: list[int]) -> None:
    """The fields whose per-sample shape differs inside a batch the collate function could not stack: the
    first sample (by index) whose shape is not the field's first one."""
    per = [dict(B.flatten(p)) for p in parts]
    for name, t in per[0].items():
        st = out.fields.get(name)
        ref = st.first_shape if st is not None and st.first_shape is not None else tuple(t.shape[1:])
        for d, i in zip(per, idx):
            shape = tuple(d[name].shape[1:]) if name in d else None
            if shape != ref:
                if st is None:
                    st = out.fields[name] = FieldStats(name, _role(out.roles, name))
                if st.ragged_at is None:
                    st.ragged_at, st.ragged_shape, st.ragged_ref = i, shape, ref
                break


def _role(roles, name: str) -> str:
    if roles is None:
        return "other"
    return "target" if name == roles.target else "input" if name in roles.inputs else "other"


def _feed(out: SplitScan, batch, idx: list[int], opts, against: SplitScan | None) -> None:
    roles = out.roles
    fields = B.flatten(batch)
    for name, t in fields:
        st = out.fields.get(name)
        if st is None:
            st = out.fields[name] = FieldStats(name, _role(roles, name))
        st.update(t, idx)
        if out.weights is not None and st.role == "target":
            st.drawn_by(t, out.weights[idx])
    named = dict(fields)
    inputs = [named[n] for n in roles.inputs if n in named and named[n].dim() > 0]
    if inputs and all(t.shape[0] == len(idx) for t in inputs):
        digests = Hashes.digests(inputs)
        out.hashes.add(digests, idx)
        out.space.add(inputs)
        if against is not None:
            labels = _sample_labels(named.get(roles.target), len(idx))
            for k, (d, i) in enumerate(zip(digests, idx)):
                j = against.hashes.first.get(d)
                if labels is not None:
                    count = out.by_label.setdefault(labels[k], [0, 0])
                    count[0] += 1
                    count[1] += j is not None
                if j is not None:
                    out.overlap += 1
                    if len(out.overlap_pairs) < 20:
                        out.overlap_pairs.append((j, i))
    if inputs:
        _blank(out, inputs[0], named.get(roles.target), idx)
    if opts.pictures and opts.per_class and inputs:
        _collect(out, inputs[0], named.get(roles.target), opts.per_class)


def _sample_labels(y, n: int) -> list | None:
    """One class per sample: an (N,) or (N, 1) integral target, or an (N, C) one-hot (its argmax); else None."""
    if not isinstance(y, torch.Tensor) or not y.dim() or y.shape[0] != n or y.is_complex():
        return None
    flat = y.detach().reshape(n, -1)
    if flat.shape[1] == 1:
        column = flat[:, 0]
        whole = not column.is_floating_point() or bool((column == column.round()).all())
        return column.to(torch.int64).tolist() if whole else None
    one_hot = flat.is_floating_point() and bool(((flat == 0) | (flat == 1)).all()) and bool((flat.sum(1) == 1).all())
    return flat.argmax(1).tolist() if one_hot else None


def _blank(out: SplitScan, x, y, idx: list[int]) -> None:
    """Image samples that are one value throughout (a black image: a file that failed to load, a transform that
    blanked a class), per label (a sweep: every image of one class black was only `duplicate-samples`)."""
    if x.dim() < 3 or layout(tuple(x.shape[1:])) is None or x.is_complex() or x.shape[0] != len(idx):
        return
    flat = x.detach().reshape(x.shape[0], -1)
    same = (flat == flat[:, :1]).all(1)
    if not bool(same.any()):
        return
    labels = y.reshape(-1).tolist() if y is not None and y.dim() >= 1 and y.numel() == y.shape[0] \
        and not y.is_floating_point() else [None] * len(idx)
    for j in same.nonzero().flatten().tolist():
        out.blank[labels[j]] = out.blank.get(labels[j], 0) + 1
        if out.blank_first is None:
            out.blank_first = (idx[j], float(flat[j, 0]))


def _collect(out: SplitScan, x, y, per_class: int) -> None:
    if x.dim() < 2 or layout(tuple(x.shape[1:])) is None:
        return
    labels = None
    if y is not None and y.dim() >= 1 and y.numel() == y.shape[0] and not y.is_complex():
        labels = y.reshape(-1).tolist()
    full = [k for k, v in out.gallery.items() if len(v) >= per_class]
    if labels is not None and full and set(labels) <= set(full) or labels is None and full:
        return     # nothing of this batch goes into the grid
    for j in range(x.shape[0]):
        key = labels[j] if labels is not None else "all"
        key = int(key) if isinstance(key, float) and key.is_integer() else key
        got = out.gallery.setdefault(key, [])
        if len(got) < per_class and len(out.gallery) <= 64:
            got.append(x[j].detach().cpu().to(torch.float32).numpy().copy())
