"""Dead units judged on enough, different samples (bench/corpus-findings.md item 6).

"0 for every sample of the batch" alone is chance when the samples are few or alike: a healthy
freshly initialised unit whose pre-activation sits just below zero is 0 for both samples of a batch
of 2 about half the time, and a squeeze-excitation layer sees nearly the same pooled vector for every
noise image, so its units are 0 for all of them or for none. A module flagged on the judged batch is
re-judged, forward only (no_grad, the same train/eval mode, stochastic depth off, seeded), on the
judged batch plus MIN_SAMPLES fresh samples of the same shapes that differ from each other (each
sample its own scale and per-channel offset). A unit is dead only when its pre-activation (the
module's input) stays at or below the point where the activation is 0 on every one of those samples,
by more than MARGIN times the spread (standard deviation) of that module's pre-activations: a unit
pushed far negative (a bias of -5 or -1e3) is dead, one hovering just below zero is not.
Statistics stay on the device; the counts come back in one read. Runs only when a module is flagged."""
from __future__ import annotations

from dataclasses import dataclass

from ...core.design import stochastic_depth_off
from ...core.fresh import MIN_SAMPLES, fresh_batches
from ...core.guard import leave_no_trace
from ...core.readback import read_back
from ...core.tracking import run_forward
from ...errors import ModelError

MARGIN = 0.5        # × the module's pre-activation std: how far below the zero point a dead unit stays

RULE = (f"a unit is dead when its input stays below the activation's zero point by more than {MARGIN:g}× the "
        f"spread of the module's inputs on the batch and on {MIN_SAMPLES} fresh random samples")


@dataclass
class Judged:
    dead: int                 # units dead by the rule
    units: int
    samples: int              # samples judged on (the batch + the fresh ones)


def zero_edge(mod) -> float:
    """The input at or below which the module outputs 0."""
    from torch import nn

    if isinstance(mod, nn.Hardswish):
        return -3.0
    if isinstance(mod, nn.Threshold):
        return float(mod.threshold)
    return 0.0


class _Acc:
    """Per call site of one module: the per-unit max of its input and the moments of all its values."""

    def __init__(self):
        self.max = None
        self.n: list[int] = []
        self.means: list = []
        self.m2: list = []
        self.bad = False          # unit count changed between passes: not judged

    def add(self, z) -> None:
        import torch

        zf = z.detach().float()
        z2 = zf.reshape(zf.shape[0], -1) if zf.dim() >= 2 else zf.reshape(1, -1)
        top = z2.amax(0)
        if self.max is not None and self.max.shape != top.shape:
            self.bad = True
            return
        self.max = top if self.max is None else torch.maximum(self.max, top)
        var, mean = torch.var_mean(zf, correction=0)
        self.n.append(zf.numel())
        self.means.append(mean)
        self.m2.append(var * zf.numel())

    def dead(self, edge: float):
        """0-d device tensor: units whose max stays ≤ edge − MARGIN × std (moments merged exactly)."""
        import torch

        n = sum(self.n)
        means = torch.stack(self.means)
        counts = torch.tensor(self.n, dtype=means.dtype, device=means.device)
        mean = (means * counts).sum() / n
        m2 = torch.stack(self.m2).sum() + (counts * (means - mean) ** 2).sum()
        std = (m2 / n).clamp_min(0).sqrt()
        return (self.max <= edge - MARGIN * std).sum()


def judge(model, inputs, opts, ctx, names: list[str]) -> dict[str, Judged]:
    """Re-judge the modules `names` (flagged on the judged batch); {} when the model cannot be re-run."""
    if not names:
        return {}
    modules = dict(model.named_modules())
    accs: dict[str, list[_Acc]] = {}
    # fresh values for every tensor; when the model refuses them, for the data only: a detection model's
    # target boxes made noise have negative sizes (torchvision's Faster R-CNN raises), its images do not
    for min_dim in (0, 3):
        fresh = fresh_batches(inputs, ctx.seed, min_dim)
        if not fresh:
            return {}   # nothing would be fresh: the judged batch repeated confirms nothing
        batches = [inputs] + fresh
        accs = {n: [] for n in names}
        try:
            _passes(model, batches, opts, ctx, modules, accs)
            break
        except ModelError:
            continue
    else:
        return {}
    keep = [n for n in names if accs[n] and not any(a.bad or a.max is None for a in accs[n])]
    counts = read_back([sum(a.dead(zero_edge(modules[n])) for a in accs[n]) for n in keep])   # the one sync
    samples = sum(b.batch_size or 1 for b in batches)
    return {n: Judged(int(c), sum(a.max.numel() for a in accs[n]), samples) for n, c in zip(keep, counts)}


def _passes(model, batches, opts, ctx, modules, accs) -> None:
    import torch

    def hook(name):
        def pre(mod, args):
            calls[name] += 1
            if args and isinstance(args[0], torch.Tensor) and args[0].is_floating_point():
                if calls[name] > len(accs[name]):
                    accs[name].append(_Acc())
                accs[name][calls[name] - 1].add(args[0])
        return pre

    handles = [modules[n].register_forward_pre_hook(hook(n)) for n in accs]
    try:
        with leave_no_trace(model, buffers=True):
            model.train(not opts.eval_mode)
            stochastic_depth_off(model)
            with torch.no_grad(), ctx.seeded(), ctx.autocast():
                for batch in batches:
                    calls = dict.fromkeys(accs, 0)
                    run_forward(model, batch, phase="forward (dead-unit re-check)")
    finally:
        for h in handles:
            h.remove()
