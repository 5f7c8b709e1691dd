"""Statistics stay on the device until every one of them is known, then come back in one read.

A host sync per parameter or per module drains a GPU queue each time and slows the run: per-parameter
norms are batched with `torch._foreach_norm`, activation statistics were reduced in the hooks, and
the loss, the norms and the activation statistics are stacked into one tensor and read back with
one `.tolist()`. Counting NaN/Inf values is a second read, made only when a norm is not finite."""
from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

from ...core.device import wide_float, widened
from ...core.precision import is_reduced

# per-parameter statistics read back: weight norm, then (gradient) L2, L1 and L-inf norms
WEIGHT, L2, L1, LINF = range(4)


class Slots:
    """0-d device tensors collected in order and read back together."""

    def __init__(self):
        self.items: list = []

    def add(self, tensors) -> slice:
        start = len(self.items)
        self.items.extend(tensors)
        return slice(start, len(self.items))

    def read(self, device) -> list[float]:
        """Every slot as a Python float, in order: one stack per (device, dtype) group, one read."""
        import torch

        if not self.items:
            return []
        dtype = wide_float(device)   # counts stay exact to 2**53 (2**24 on mps)
        groups: dict = defaultdict(list)
        for i, t in enumerate(self.items):
            groups[(t.device, t.dtype)].append(i)
        order = [i for idx in groups.values() for i in idx]
        stacked = torch.cat([torch.stack([self.items[i].reshape(()) for i in idx]).to(device=device, dtype=dtype)
                             for idx in groups.values()])
        values = stacked.tolist()                       # the one host sync
        out = [0.0] * len(values)
        for pos, i in enumerate(order):
            out[i] = values[pos]
        return out


def norms(tensors, ord) -> list:
    """The `ord` norm of each tensor as a 0-d tensor (float32 or wider), batched per device and dtype."""
    import torch

    out: list = [None] * len(tensors)
    groups: dict = defaultdict(list)
    for i, t in enumerate(tensors):
        if t.numel() == 0:          # no identity for the max norm; every norm of nothing is 0
            out[i] = torch.zeros((), dtype=torch.float32, device=t.device)
        elif not (t.is_floating_point() or t.is_complex()):   # a frozen int/bool parameter: norms need floats
            out[i] = torch.linalg.vector_norm(widened(t), ord)
        else:
            groups[(t.device, t.dtype)].append(i)
    for (_, dtype), idx in groups.items():
        # half precision is accumulated in float32; float64 and complex keep their own precision
        kw = {"dtype": torch.float32} if is_reduced(dtype) else {}
        for i, n in zip(idx, torch._foreach_norm([tensors[i] for i in idx], ord, **kw)):
            out[i] = n
    return out


def grad_values(g):
    """The values of a gradient (a sparse one's stored values), detached."""
    return (g.coalesce()._values() if g.is_sparse else g).detach()


@dataclass
class Stats:
    loss: float
    params: dict[str, list[float]]                 # name → [weight, l2, l1, linf] ([weight] without a grad)
    acts: dict[str, dict] = field(default_factory=dict)   # module → per-call lists: s, ss, zeros, dead, sat
    nonfinite: dict[str, tuple[int, int]] = field(default_factory=dict)   # name → (NaN, Inf) counts
    underflow: dict[str, float] = field(default_factory=dict)   # name → values below `tiny` (reduced precision)


def read_stats(pas, params: dict, device, tiny: float | None = None) -> Stats:
    """The loss, per-parameter norms and activation statistics of a recorded pass, read back once;
    with `tiny` (reduced precision) also each gradient's count of values below it (underflow.py)."""
    import torch

    names = list(params)
    dense = {n: grad_values(pas.grads[n]) for n in names if pas.grads[n] is not None}
    gnames = [n for n in names if n in dense]
    slots = Slots()
    loss_at = slots.add([pas.loss.float().reshape(())])
    w_at = slots.add(norms([params[n].detach() for n in names], 2))
    g_at = [slots.add(norms([dense[n] for n in gnames], o)) for o in (2, 1, math.inf)]
    if tiny is not None:
        from .underflow import counts

        u_at = slots.add(counts([dense[n] for n in gnames], tiny))
    act_at = {}
    for name, act in pas.rec.acts.items():
        act_at[name] = {k: slots.add(getattr(act, k)) for k in ("s", "ss", "zeros", "dead", "sat")}
    values = slots.read(device)

    per_param = {n: [w] for n, w in zip(names, values[w_at])}
    for at in g_at:
        for n, v in zip(gnames, values[at]):
            per_param[n].append(v)
    acts = {name: {k: values[at] for k, at in ats.items()} for name, ats in act_at.items()}
    stats = Stats(values[loss_at][0], per_param, acts)
    if tiny is not None:
        stats.underflow = dict(zip(gnames, values[u_at]))
    # NaN/Inf counts only where a norm is not finite (a finite L1 norm means all values are finite)
    suspect = [n for n in gnames if not all(math.isfinite(v) for v in per_param[n][L2:])]
    if suspect:
        counts = Slots()
        for n in suspect:
            counts.add([torch.isnan(dense[n]).sum(), torch.isinf(dense[n]).sum()])
        got = counts.read(device)
        stats.nonfinite = {n: (int(got[2 * i]), int(got[2 * i + 1])) for i, n in enumerate(suspect)}
    return stats
