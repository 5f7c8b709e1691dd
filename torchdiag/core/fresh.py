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
