"""Loader settings that are known traps, judged by what the loader does where that can be measured:
label runs (an unshuffled training loader), a last batch of one sample, workers that repeat each other's
random augmentations, num_workers=0 on a many-core machine, pin_memory without CUDA, workers restarted
every epoch at a measured cost."""
from __future__ import annotations

import os

import torch

from ...core import batches as B

RUN_FACTOR = 3.0        # mean label run this many times what shuffled data gives: not shuffled
MANY_CORES = 4
RESTART_S = 0.5         # a worker start this long (measured) ...
RESTART_SHARE = 0.05    # ... and this share of an epoch: persistent_workers pays off


def label_runs(labels: list[int], counts: dict[int, int] | None) -> dict | None:
    """Mean length of runs of equal consecutive labels, and what a shuffled order would give
    (1 / (1 − Σ p²) for class frequencies p)."""
    if len(labels) < 8:
        return None
    runs, n = 1, len(labels)
    for a, b in zip(labels, labels[1:]):
        runs += a != b
    observed = n / runs
    freq = counts or {}
    if not freq:
        for v in labels:
            freq[v] = freq.get(v, 0) + 1
    total = sum(freq.values())
    same = sum((c / total) ** 2 for c in freq.values())
    expected = 1.0 / (1.0 - same) if same < 1 else float("inf")
    return {"samples": n, "mean_run": observed, "shuffled_mean_run": expected,
            "longest_run": _longest(labels), "not_shuffled": expected != float("inf") and observed >= RUN_FACTOR * expected}


def _longest(labels) -> int:
    best = cur = 1
    for a, b in zip(labels, labels[1:]):
        cur = cur + 1 if a == b else 1
        best = max(best, cur)
    return best


def last_batch(loader) -> tuple[int, int] | None:
    """(samples in an epoch, samples in its last batch) of a DataLoader that keeps a partial last batch."""
    bs = loader.batch_size
    if bs is None or loader.drop_last:
        return None
    try:
        n = len(loader.sampler)
    except TypeError:
        return None
    return n, n % bs


def cpu_count() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _same(a, b) -> bool:
    fa, fb = B.flatten(a), B.flatten(b)
    return len(fa) == len(fb) and all(x.shape == y.shape and torch.equal(x, y) for (_, x), (_, y) in zip(fa, fb))


def _collates(collate, sample) -> bool:
    try:
        collate([sample])
    except Exception:   # noqa: BLE001 - a sample default_collate cannot take (None): the loader's own is asked
        return False
    return True


def workers_repeat(dataset, loader, timeout: float) -> dict | None:
    """Behaviour, not source: when dataset[0] differs between two calls here (random augmentation), load it
    in two workers, twice (two epochs, fresh workers). Identical samples across workers or epochs mean every
    worker starts from the same random state: a generator the dataset owns (created in __init__) is copied
    into each worker, while torch seeds only `random`, torch and numpy's global RNG per worker."""
    from torch.utils.data import DataLoader
    from torch.utils.data._utils.collate import default_collate

    from ...core.fetch import guarded
    from .scan import SafeCollate

    # the loader's own collate (a review: a Dataset returning None for bad samples, its collate dropping them, was
    # an internal error in default_collate); a sample it cannot collate alone says nothing here
    try:
        a, b = dataset[0], dataset[0]
        collate = default_collate if _collates(default_collate, a) else getattr(loader, "collate_fn", None)
        if collate is None or _same(collate([a]), collate([b])):
            return None          # deterministic per index: nothing to repeat
    except Exception:   # noqa: BLE001 - the user's dataset or collate: the scan reports its failures
        return None
    epochs = []
    ctx = loader.multiprocessing_context if loader is not None else None
    init = loader.worker_init_fn if loader is not None else None
    for _ in range(2):
        dl = DataLoader(dataset, batch_size=1, sampler=[0, 0], num_workers=2, collate_fn=SafeCollate(collate),
                        multiprocessing_context=ctx, worker_init_fn=init)
        fetcher, cleanup = guarded(dl, timeout, label="the worker randomness check")
        try:
            epochs.append(list(fetcher))
        finally:
            cleanup()
    across_workers = _same(epochs[0][0], epochs[0][1])
    across_epochs = _same(epochs[0][0], epochs[1][0])
    if not (across_workers or across_epochs):
        return None
    return {"across_workers": across_workers, "across_epochs": across_epochs}


def setting_traps(loader, timing, device, epoch_batches: int | None) -> list[tuple[str, str, str, str]]:
    """(code, severity, message, hint) for the loader's settings that are known traps."""
    out = []
    cpus = cpu_count()
    if loader.num_workers == 0 and cpus >= MANY_CORES:
        out.append(("no-workers", "info", f"num_workers=0 on a machine with {cpus} CPU cores: loading runs in the "
                    "training process, between steps",
                    "the num_workers sweep above shows what workers give; try the fastest"))
    if loader.pin_memory and device.type != "cuda":
        out.append(("pin-memory-without-cuda", "info", f"pin_memory=True, but the run is on {device.type}: pinned "
                    "memory only speeds up copies to a CUDA GPU", "set pin_memory=torch.cuda.is_available()"))
    if loader.num_workers > 0 and not loader.persistent_workers and timing is not None and timing.first_batch_s \
            and timing.batches_per_s:
        start = timing.first_batch_s - 1.0 / timing.batches_per_s
        epoch = (epoch_batches or 0) / timing.batches_per_s
        if start >= RESTART_S and (not epoch or start >= RESTART_SHARE * epoch):
            share = f" ({100 * start / epoch:.0f}% of an epoch's {epoch:.1f} s)" if epoch else ""
            out.append(("workers-restart-each-epoch", "info",
                        f"starting the {loader.num_workers} workers took {start:.2f} s{share}, paid again every epoch "
                        "(persistent_workers=False)", "set persistent_workers=True to keep the workers between epochs"))
    return out
