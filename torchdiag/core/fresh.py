"""Fresh inputs of the batch's kind: the same shapes, values drawn from each tensor's own spread, batches that differ
from each other. What re-judges a verdict that a few alike samples may have made by chance (gradflow's dead units,
parameters an input-routed forward left without a gradient: core/unreached.py)."""
from __future__ import annotations

import math

from . import seeds
from .device import widened

MIN_SAMPLES = 16    # fresh samples a flagged module is re-judged on (besides the judged batch)


def fresh_batches(inputs, seed: int, min_dim: int = 0, samples: int = MIN_SAMPLES) -> list:
    """Batches of the same shapes as `inputs`, enough for `samples` samples, that differ from each other (the
    tensors of fewer than `min_dim` dimensions kept as given); none when no tensor would be made fresh."""
    import torch

    n = inputs.batch_size or 1
    out, made = [], [0]
    for k in range(math.ceil(samples / n)):
        gens: dict = {}

        def fresh(t, k=k, gens=gens):
            if t.dim() < min_dim:
                return t
            if t.device not in gens:
                gens[t.device] = torch.Generator(device=t.device).manual_seed(seeds.fresh_batch(seed, k))
            new = fresh_tensor(t, gens[t.device])
            made[0] += new is not t
            return new
        out.append(inputs.map(fresh))
    return out if made[0] else []


def fresh_tensor(t, g):
    """Float: Gaussian noise with the tensor's mean and std, each sample with its own scale (0.5–2×)
    and offset per index of dim 1 (an image's channel: a colour cast); integer: uniform in the
    tensor's own [min, max] (ids stay in range, an all-ones mask stays all ones); others as given."""
    import torch

    if t.is_nested or t.is_sparse or t.numel() == 0 or t.dtype == torch.bool or t.is_complex():
        return t
    if not t.is_floating_point():
        lo, hi = t.min(), t.max()
        u = torch.rand(t.shape, generator=g, device=t.device)
        return (lo + (u * widened(hi - lo + 1)).floor().to(t.dtype)).minimum(hi)
    tf = t.detach().float()
    std, mean = torch.std_mean(tf, correction=0)
    x = torch.randn(t.shape, generator=g, device=t.device)
    if t.dim() >= 2:
        per = (t.shape[0],) + (1,) * (t.dim() - 1)
        scale = torch.rand(per, generator=g, device=t.device) * 1.5 + 0.5
        offset = torch.randn((t.shape[0], t.shape[1]) + (1,) * (t.dim() - 2), generator=g, device=t.device)
        x = x * scale + offset
    return (x * std + mean).to(t.dtype)


RESAMPLE_TRIES = 8   # draws of another sample for an entry whose drawn value is NaN or infinite


def resampled_batches(inputs, seed: int, samples: int, vocab: dict | None = None) -> list:
    """Batches of the same shapes as `inputs`, enough for `samples` samples, each entry of a tensor that holds the
    batch (leading size the batch's) drawn from the same entry of a random sample of the batch, finite where the
    batch has a finite value there: new combinations of the batch's own values, never a value it lacks (a 0/1 flag
    stays 0 or 1, [0, 1] pixels stay in [0, 1], a column of categories keeps its categories). A one-hot vector along
    the last dimension is drawn whole, so it stays one (_modes). Token ids the forward looks up whole in one table
    (`vocab`: name -> the table's rows) are drawn from that table below the largest id the batch holds once, except
    where the draw took a special id (BOS, padding) from the batch, which stays (_table, _tokens): two sequences of
    four ids held eight, and a router that sees only the token could send no fresh batch anywhere new. Tensors of
    one shape share their draws (ids and their attention mask stay paired where the ids are the batch's own). None
    for a batch of one or of identical samples, or when nothing would be fresh.

    Inputs torchdiag made up itself (a source's default) are drawn as that source drew them (fresh_batches): their
    values stand for no data."""
    if getattr(inputs, "chosen", False):
        return fresh_batches(inputs, seed, samples=samples)
    import torch

    n = inputs.batch_size or 1
    if n < 2 or inputs.samples is not None:   # a list of samples (detection images): no tensor holds the batch
        return []
    modes = _modes(inputs, n)
    if not _varies(inputs, modes):   # every sample the same: any resampling is the batch again
        return []
    tables = {id(t): _table(t, (vocab or {})[k]) for k, t in inputs.tensors() if k in (vocab or {})}
    out = []
    for k in range(math.ceil(samples / n)):
        def resample(t, k=k):
            mode = modes.get(id(t))
            if mode is None:
                return t
            g = torch.Generator(device=t.device).manual_seed(seeds.fresh_batch(seed, k))
            if id(t) in tables:
                return _tokens(t, g, *tables[id(t)])
            return _resampled(t, g, mode)
        out.append(inputs.map(resample))
    return out if any(b is not a for o in out for (_, a), (_, b) in zip(inputs.tensors(), o.tensors())) else []


def _varies(inputs, modes: dict) -> bool:
    """Some tensor that holds the batch differs between its samples."""
    return any(bool((t.detach() != t.detach()[:1]).any()) for _, t in inputs.tensors() if id(t) in modes)


def _table(t, rows: int) -> tuple:
    """How token ids are drawn (_tokens): (the special ids, top). An id the batch holds at least once per sample on
    average (BOS, EOS, padding, a separator) is special: drawn where the batch has it, it stays (a router reading only
    the first token, left-padded so that PAD or BOS came first, was routed, info, with random first tokens: a review).
    The others are drawn below top, the largest id the batch holds once + 1 (a table may have rows no real token
    uses, where a forward indexing a per-token buffer of the real size refused row 123; a padding id at the top of
    the vocabulary, repeated, says nothing of the words: a review)."""
    import torch

    src = t.detach()
    ids, counts = torch.unique(src, return_counts=True)
    once = ids[counts == 1]   # a repeated id is weaker evidence of how far the words go (a padding run at the top)
    plain = once if once.numel() else ids[counts < src.shape[0]]
    return ids[counts >= src.shape[0]], min(int(plain.max()) + 1, rows) if plain.numel() else 0


def _tokens(t, g, special, top: int):
    """Each id drawn as any entry is (the same entry of a random sample of the batch: paired with the mask, which
    draws the same picks first), then, unless special, replaced by an id uniform in [0, top)."""
    import torch

    own = _resampled(t, g, ENTRY)
    if top < 1:
        return own
    drawn = torch.randint(0, top, t.shape, generator=g, device=t.device, dtype=t.dtype)
    return torch.where(torch.isin(own, special), own, drawn)


ENTRY, VECTOR = "entry", "vector"


def _modes(inputs, n: int) -> dict:
    """id of each tensor that holds the batch -> how it is drawn: VECTOR when it is one-hot along the last dimension
    (drawn entry by entry, a task given as one-hot became two tasks at once, and a router that summed it instead of
    taking its argmax looked routed), else ENTRY (tensors of one shape drawn so share their draws)."""
    modes: dict = {}
    for _, t in inputs.tensors():
        if t.is_nested or t.is_sparse or t.dim() == 0 or t.numel() == 0 or t.shape[0] != n:
            continue   # kept as given
        modes[id(t)] = VECTOR if t.dim() >= 2 and not t.is_complex() and t.shape[-1] > 1 and _one_hot(t) else ENTRY
    return modes


def _one_hot(t) -> bool:
    """Every vector along the last dimension is 0 but for one 1 (rows that merely sum alike, z-scored or softmaxed
    features, are drawn entry by entry: drawn whole, a fresh batch was the batch's rows reordered; a review)."""
    v = t.detach()
    return bool(((v == 0) | (v == 1)).all() and (v == 1).sum(-1).eq(1).all())


def _picks(t, g, mode: str):
    """Flat indices into t, one per entry: the entry's own index in a random sample (ENTRY), the same sample for
    every entry of a last-dimension vector (VECTOR)."""
    import torch

    size = t.numel() // t.shape[0]
    shape = t.shape[:-1] + (1,) if mode == VECTOR else t.shape
    rows = torch.randint(0, t.shape[0], shape, generator=g, device=t.device).expand(t.shape)
    return rows * size + torch.arange(size, device=t.device).view(t.shape[1:])


def _resampled(t, g, mode: str):
    """t with each entry taken as _picks says, redrawn where the value taken is not finite (kept non-finite only
    where RESAMPLE_TRIES draws found nothing else)."""
    import torch

    src = t.detach().reshape(-1)
    out = src[_picks(t, g, mode)]
    if not (src.is_floating_point() or src.is_complex()):
        return out.to(t.dtype)
    for _ in range(RESAMPLE_TRIES):
        bad = ~out.isfinite()
        out = torch.where(bad, src[_picks(t, g, mode)], out)
    return out
