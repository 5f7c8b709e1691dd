"""A model no optimizer trains, run under no_grad in train mode while another one trains: a frozen teacher whose
`.eval()` was forgotten. Its dropout draws new noise into every target it gives, and its BatchNorm running
statistics follow the training batches instead of the ones it was trained with. Seen while watch looks for the
models (discovery, the first steps: `watch --` and `Watch()` without a model), judged at the end: still in train
mode, weights in no optimizer and unchanged over the run (an EMA teacher's change: not this), none of them a
trained model's, and a dropout with p > 0 or a BatchNorm whose batch count grew. Observed at each read, with the
read's values (no sync of its own), so a model the script let go by the end keeps its last verdict. Cost: a scan of
the module's submodules at its first call under no_grad, and a few values per read."""
from __future__ import annotations

import weakref


class Probe:
    """What a module called under no_grad held at its first such call."""

    def __init__(self, module, step: int, sensitive: tuple):
        import torch

        from .engine import inner
        from .names import user_names

        m = inner(module)
        self.ref, self.step = weakref.ref(module), step
        self.name = ""
        dropout, bn = sensitive
        self.dropout = [n for n, s in m.named_modules() if isinstance(s, dropout) and s.training and s.p > 0]
        self.bns = [(n, weakref.ref(s), s.num_batches_tracked.detach().clone()) for n, s in m.named_modules()
                    if isinstance(s, bn) and s.training and s.track_running_stats and s.num_batches_tracked is not None]
        params = [p for p in m.parameters()]
        self.relevant = bool(params) and m.training and bool(self.dropout or self.bns)
        with torch.no_grad():
            self.sum = torch.stack([p.detach().float().sum().to(params[0].device) for p in params]).sum() \
                if self.relevant else None
        self.live_names: list[str] = []
        self.verdict: dict | None = None   # as of the last read (take)
        if self.relevant:   # the name the calling frames give it (`teacher`), else its type
            names = user_names(module, lambda v: v is module)
            self.name = names[0] if names else type(m).__name__


def frozen_probe(module, step: int, sensitive: tuple) -> Probe | None:
    """A Probe of `module` when it is worth judging at the end (weights, train mode, a dropout or BatchNorm)."""
    probe = Probe(module, step, sensitive)
    return probe if probe.relevant else None


def observe(probe: Probe, trained: set[int]):
    """What a read takes of a probe: (still in train mode with weights none of `trained`, the device values to read:
    [weights unchanged, each BatchNorm's batch count now, then at first sight]), or None when the module is gone."""
    import torch

    from .engine import inner

    module = probe.ref()
    if module is None or probe.sum is None:
        return None
    m = inner(module)
    params = list(m.parameters())
    if not params:
        return None
    host = m.training and not any(id(p) in trained for p in params)
    live = [(n, bn, before) for n, r, before in probe.bns if (bn := r()) is not None]
    probe.live_names = [n for n, _, _ in live]
    with torch.no_grad():
        now = torch.stack([p.detach().float().sum().to(params[0].device) for p in params]).sum()
        values = torch.stack([(now == probe.sum.to(now.device)).double()]
                             + [b.num_batches_tracked.double().to(now.device) for _, b, _ in live]
                             + [before.double().to(now.device) for _, _, before in live])
    return host, values


def take(probe: Probe, host: bool, read: list) -> None:
    """A read's values (observe's): the probe's verdict as of that read, kept for the end (the model may be gone)."""
    k = len(probe.live_names)
    grew = [(n, int(read[1 + k + i]), int(read[1 + i])) for i, n in enumerate(probe.live_names)
            if read[1 + i] > read[1 + k + i]]
    # its weights changed (an EMA teacher, a copy loaded now and then), it was put in eval, or it is trained: not this
    ok = host and read[0] == 1.0 and bool(grew or probe.dropout)
    probe.verdict = {"name": probe.name, "step": probe.step, "dropout": probe.dropout, "bns": grew} if ok else None
