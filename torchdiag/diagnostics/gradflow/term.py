"""Is a large grad/weight large where the parameter acts? The ratio says a plain step at lr moves the parameter by
lr × ratio of its norm; what that step changes is the output of the module the parameter belongs to. For a weight
the two agree (its gradient lies along its inputs, so the output moves at least as far, relative to itself); for a
small term beside what it is added to they do not: a spectral-norm discriminator's scalar output bias, drawn at
0.005 by PyTorch's U(±1/√4096) under logits of RMS ~0.5, gets grad/weight 100–175 from a gradient of 0.5 (the
batch all of one class, as a discriminator's real batch is) in about a third of its draws, and moving it by its
own norm moves the logits by 1%. Measured on a copy (one forward and backward for the gradient's direction, then
one forward per asked parameter): each moved against its gradient by EPS of its norm alone, the relative change
of its module's output (the innermost module holding it whose output moves; the model's output at the last) over
EPS is its reach s (the model's output's, where that moves further: a parameter also used elsewhere), and ratio × s
is the ratio where it acts. Within --exploding-ratio: `small-term` (info). Asked
of the grad/weight verdicts (the gradient's norm within --exploding) the short training run left standing.
The same probe reads a vanishing gradient where it acts (cancellations): whether the terms of its gradient at
the module's output are large ones that cancel (`cancelled`, info, in gated.py)."""
from __future__ import annotations

from dataclasses import dataclass, field

from ...core.device import widened
from ...core.module_paths import ancestors, owner

EPS = 1e-2          # the move, relative to the parameter's norm: a first-order probe (a bias moves its output exactly)
MAX_TERMS = 16      # parameters asked at most (the rest keep their verdict)


@dataclass
class Reach:
    module: str       # where it was read: the innermost module holding it whose output moved, or the model
    reach: float      # that output's relative change over EPS: grad/weight × reach is the ratio where it acts


def reaches(model, inputs, names: list[str], ctx, prepare, eval_mode: bool) -> dict[str, Reach]:
    """name -> Reach for each of `names` (at most MAX_TERMS) whose move changed some module's output holding it."""
    got = _probe(model, inputs, names, ctx, prepare, eval_mode, "a large ratio read where it acts",
                 lambda diffs, _grads: [_norm(diffs)])
    return _read(got.asked, [{p: v[0] for p, v in m.items()} for m in got.moves], got.sizes)


CANCELS = 1e-3      # |sum g_i d_i| / sum |g_i d_i| below this / sqrt(n_eff) is cancelled: terms of random signs
                    # leave ~1/sqrt(n_eff) of their magnitudes (n_eff, their participation ratio), and a thousandth
                    # of that by chance about once in a thousand draws


MIN_TERMS = 32      # n_eff below this: not judged (a saturated softmax's two near-tied logits cancel too: a review)


@dataclass
class Cancel:
    module: str       # the innermost module holding it whose output moved
    share: float      # |sum_i g_i d_i| / sum_i |g_i d_i|: what is left of the terms once they are summed
    terms: float      # n_eff = (sum |g_i d_i|)^2 / sum (g_i d_i)^2: how many terms carry it
    parts: list = field(default_factory=list)   # [sum t, sum |t|, sum t^2] per output the loss read (one per call)

    def bound(self) -> float:
        return _bound(self.terms)

    def cancelled(self) -> bool:
        """Its terms cancel, and the outputs (calls) whose terms do not cancel on their own cancel together: a module
        also called where its gradient just vanishes (a saturated gate) adds small terms that cancel with nothing, and
        pooled they hid under the large ones (a review); two calls normalised together (one BatchNorm over both
        views' features) cancel only together (a second review). Few terms cancel by structure (a softmax's rows
        sum to 0): MIN_TERMS is asked of the whole only, so a call on a few values (a class token) may cancel."""
        alone = [q for q in self.parts if not _cancels(*q)]
        together = not alone or _cancels(*(sum(q[i] for q in alone) for i in range(3)))
        return self.terms >= MIN_TERMS and self.share < self.bound() and together


def _bound(terms: float) -> float:
    return CANCELS / max(terms, 1.0) ** 0.5


def _cancels(dot: float, mag: float, sq: float) -> bool:
    """Terms summing to dot (sum |term| = mag, sum term^2 = sq) leave under CANCELS of what random signs would."""
    share, terms = _shares(dot, mag, sq)
    return share < _bound(terms)


def cancellations(model, inputs, names: list[str], ctx, prepare, eval_mode: bool) -> dict[str, Cancel]:
    """name -> Cancel for each of `names` (at most MAX_TERMS): whether its small gradient is a sum of large terms that
    cancel. Moved along its gradient by EPS of its norm, its module's output moves by d; to first order the loss moves
    by sum_i g_i d_i (g = dL/d output), its gradient's share. When the terms g_i d_i are large and their sum is a
    tiny part of their magnitudes, the loss reads what the parameter changes and something after it takes the
    change back (a scalar gain before a convolution and BatchNorm: BatchNorm divides out the scale it sets). A
    gradient small because little arrives where the move lands (a chain of saturated sigmoids, a padding step an RNN
    is read at, an output scaled down by a bug, a backward that scales the gradient) has terms that are small, not
    cancelled: its share is large. Measured directly on the output's gradient and move (widened to float64)."""
    got = _probe(model, inputs, names, ctx, prepare, eval_mode, "a small gradient read where it acts", _terms)
    out: dict[str, Cancel] = {}
    for n, moved in zip(got.asked, got.moves):
        path = next((a for a in ancestors(owner(n)) if a in moved and sum(moved[a][1::3]) > 0), None)
        if path is None:
            continue
        sums = moved[path]
        parts = [sums[i:i + 3] for i in range(0, len(sums), 3) if sums[i + 1] > 0]
        out[n] = Cancel(path, *_shares(*(sum(sums[i::3]) for i in range(3))), parts=parts if len(parts) > 1 else [])
    return out


def _shares(dot: float, mag: float, sq: float) -> tuple[float, float]:
    """(share, n_eff) of terms summing to dot, with sum |term| = mag and sum term^2 = sq."""
    return abs(dot) / mag, mag * mag / sq if sq > 0 else 1.0


def _terms(diffs: list, grads: list) -> list:
    """[sum g_i d_i, sum |g_i d_i|, sum (g_i d_i)^2] per output (one per call of the module), 0-d device tensors
    (non-finite as 0)."""
    out = []
    for d, g in zip(diffs, grads):
        t = (_wide(g) * d).nan_to_num(0.0, 0.0, 0.0)   # a complex output's: Re(conj(g) d), by components
        out += [t.sum(), t.abs().sum(), t.square().sum()]
    return out


@dataclass
class _Probe:
    asked: list        # the names moved, in order
    moves: list        # per asked name: path -> the measure's values, read
    sizes: dict        # path -> |output|, read


def _probe(model, inputs, names: list[str], ctx, prepare, eval_mode: bool, why: str, measure) -> _Probe:
    """One forward and backward on a copy keeping the outputs of the modules holding `names` (at most MAX_TERMS)
    that the loss read, then one forward per name moved alone against its gradient by EPS of its norm, each path's
    move given to measure(diffs, grads) -> 0-d tensors; everything read back once."""
    import torch

    from ...core import train
    from ...core.gates import fresh_copy
    from ...core.readback import read_back
    from ...core.tracking import run_forward

    work = fresh_copy(model, ctx, eval_mode, prepare)
    params = dict(work.named_parameters())
    names = [n for n in names if n in params][:MAX_TERMS]
    modules = dict(work.named_modules())
    paths = sorted({a for n in names for a in ancestors(owner(n)) if a in modules})
    seen: dict[str, list] = {}
    state = {n: b.detach().clone() for n, b in work.named_buffers()}   # what a forward updates (a power iteration)
    hooks = [modules[p].register_forward_hook(_keep(seen, p)) for p in paths]
    try:
        with torch.enable_grad(), ctx.seeded(), ctx.autocast():
            loss = ctx.loss()(run_forward(work, inputs, phase=f"forward ({why}, on a copy)"))
        first = {p: len(outs) for p, outs in seen.items()}
        train.backward(loss)
        again = {p: _recomputed(outs, first[p]) for p, outs in seen.items() if p in first}
        read = {p: _read_outputs(seen[p], first[p], again[p]) for p in again}
        kept = {p: [seen[p][i] for i in idx] for p, idx in read.items() if idx}
        base = {p: [t.detach() for t in outs] for p, outs in kept.items()}
        grads = {p: [_grad_of(t, seen[p], again[p].get(i)).detach() for t, i in zip(outs, read[p])]
                 for p, outs in kept.items()}
        asked = [n for n in names if params[n].grad is not None and params[n].grad.shape == params[n].shape]
        moves = [{p: measure(diffs, grads[p]) for p, diffs in
                  _moved(work, params[n], inputs, ctx, seen, base, read, state).items()} for n in asked]
    finally:
        for h in hooks:
            h.remove()
    sizes = [_norm(outs) for outs in base.values()]
    flat = read_back(sizes + [v for m in moves for vs in m.values() for v in vs])
    at, values = len(sizes), []
    for m in moves:
        got = {}
        for p, vs in m.items():
            got[p] = flat[at:at + len(vs)]
            at += len(vs)
        values.append(got)
    return _Probe(asked, values, dict(zip(base, flat[:len(sizes)])))


def _grad_of(t, outs: list, again: int | None):
    """The gradient of a kept output, or of its recompute inside a reentrant checkpoint (`again`, see _recomputed)."""
    import torch

    g = t.grad if t.grad is not None else (outs[again].grad if again is not None else None)
    return g if g is not None else torch.zeros_like(t)


def _read_outputs(outs: list, first: int, again: dict[int, int]) -> list[int]:
    """Indices of a module's outputs in the forward (its first `first`) that the loss read: the output got a gradient,
    or its recompute in backward did (`again`, see _recomputed; a review: read at the model's output instead, an
    exploding bias inside a reentrant checkpoint became small-term)."""
    return [i for i in range(first) if outs[i].grad is not None or (i in again and outs[again[i]].grad is not None)]


def _recomputed(outs: list, first: int) -> dict[int, int]:
    """Forward index -> index of its recompute: inside a reentrant checkpoint the forward runs under no_grad, and
    backward runs those calls again, hooks and all, after the first `first` outputs. Calls outside it keep their graph
    and are not run again (a review: one call outside and one inside were matched by count, and the inside one was
    dropped); a call under the user's own no_grad is not one (marked by _keep from the stack, core/reentrant.py). A
    recompute is matched to the output it equals (the checkpoint restores the RNG), then, where a dropout drew
    another mask (preserve_rng_state=False), to the first left of its shape: a checkpoint whose output the loss never
    reads is not run again, and several checkpoints recompute last first (a second review: by count, the gated call
    was dropped)."""
    detached = [i for i in range(first) if not outs[i].requires_grad and getattr(outs[i], RECOMPUTED, False)]
    pairs: dict[int, int] = {}
    left = []
    for j in range(first, len(outs)):
        i = next((i for i in detached if i not in pairs and _same(outs[i], outs[j])), None)
        if i is None:
            left.append(j)
        else:
            pairs[i] = j
    for j in left:
        i = next((i for i in detached if i not in pairs and _alike(outs[i], outs[j])), None)
        if i is not None:
            pairs[i] = j
    return pairs


RECOMPUTED = "_torchdiag_recomputed"   # set by _keep on an output a reentrant checkpoint's backward will make again


def _alike(a, b) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and a.device == b.device


def _same(a, b) -> bool:
    """The same values (NaN where NaN), shape and dtype: one read-back, made only for outputs a checkpoint detached."""
    import torch

    if not _alike(a, b):
        return False
    b = b.detach()
    return bool(((a == b) | (torch.isnan(a) & torch.isnan(b)) if a.is_floating_point() or a.is_complex() else
                 (a == b)).all())


def _read(asked, moves, sizes) -> dict[str, Reach]:
    """Each asked name's reach, from the values read back (see reaches)."""
    out: dict[str, Reach] = {}
    for n, changes in zip(asked, moves):
        moved_at = [Reach(path, changes[path] / sizes[path] / EPS) for path in ancestors(owner(n))   # innermost first
                     if sizes.get(path, 0.0) > 0 and changes.get(path, 0.0) > 0]
        if moved_at:   # its own module's output, or the model's where that moves further (a use of it elsewhere)
            out[n] = max(moved_at[0], moved_at[-1], key=lambda r: r.reach)
    return out


def _moved(work, param, inputs, ctx, seen, base, read, state) -> dict:
    """path -> [Δ output] (device tensors, widened) of each hooked module's outputs the loss read (`read`: their index),
    with `param` moved against its gradient by EPS of its norm for one seeded forward from the buffers the first
    forward started from, then put back."""
    import torch

    from ...core.tracking import run_forward

    with torch.no_grad():
        for n, b in work.named_buffers():
            if n in state and b.shape == state[n].shape:
                b.copy_(state[n])
    grad = param.grad.detach()
    step = grad * (EPS * _fnorm(param.detach()) / _fnorm(grad).clamp_min(1e-30)).to(grad.dtype)
    seen.clear()
    with torch.no_grad():
        param.sub_(step)
        try:
            with ctx.seeded(), ctx.autocast():
                run_forward(work, inputs, phase="forward (a parameter moved along its gradient, on a copy)")
        finally:
            param.add_(step)
    out = {}
    for p, outs in seen.items():
        now = [outs[i] for i in read.get(p, []) if i < len(outs)]
        if p in base and len(now) == len(base[p]) and all(a.shape == b.shape for a, b in zip(now, base[p])):
            out[p] = [_wide(a) - _wide(b) for a, b in zip(now, base[p])]
    return out


def _keep(seen: dict, path: str):
    """A forward hook keeping the module's floating-point and complex outputs; those with a graph keep their gradient, so that
    only what the loss reads is compared (a second output the loss never reads moves as the parameter does, and
    made a 7.7e3× loss blow-up look small: a review)."""
    import torch

    from ...core.loss import float_outputs
    from ...core.reentrant import recomputed

    def hook(_module, _args, out):
        kept = [t for _, t in float_outputs(out, complex_too=True) if t.numel()]
        if torch.is_grad_enabled():
            for t in kept:
                if t.requires_grad:
                    t.retain_grad()
        else:
            again = recomputed()   # inside a reentrant checkpoint backward runs again (not the user's no_grad)
            kept = [t.detach() for t in kept]
            for t in kept:
                setattr(t, RECOMPUTED, again)
        seen.setdefault(path, []).extend(kept)

    return hook


def _norm(tensors):
    """The norm of several outputs together (non-finite values as 0), a 0-d device tensor."""
    import torch

    norms = [_wide(t).nan_to_num(0.0, 0.0, 0.0).norm() for t in tensors]
    return torch.stack([v.to(norms[0].device) for v in norms]).norm()


def _fnorm(t):
    """A tensor's norm in float32: half precision overflows its sum of squares, and a complex one keeps |z|."""
    return t.abs().float().norm()


def _wide(t):
    """t widened, a complex one as its real and imaginary parts (widening it to a real dtype drops the imaginary)."""
    import torch

    return widened(torch.view_as_real(t.resolve_conj()) if t.is_complex() else t)
