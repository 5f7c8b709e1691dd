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
The same probe reads a vanishing gradient where it acts (cancellations): the cosine between the gradient arriving at
the module's output and what the parameter moves there (`cancelled`, info, in gated.py)."""
from __future__ import annotations

from dataclasses import dataclass

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
    got = _probe(model, inputs, names, ctx, prepare, eval_mode, "a large ratio read where it acts")
    return _read(got.asked, got.moves, dict(zip(got.sizes, got.flat)), got.flat[len(got.sizes) + len(got.grads):])


CANCELS = 1e-3      # a cosine below this / sqrt(the output's size) is cancelled: a fixed direction against a random
                    # gradient there has |cos| ~ 1/sqrt(size) (a healthy scalar gain behind a BatchNorm: 0.005 of 8192
                    # values, 0.4 x that), and falls below a thousandth of it by chance once in ~1e3 draws


@dataclass
class Cancel:
    module: str       # the innermost module holding it whose output moved
    cos: float        # cos(dL/d output, the output's move along its gradient): the share of the signal it receives
    size: int         # the number of values of that output (the loss read)

    def bound(self) -> float:
        return CANCELS / self.size ** 0.5

    def cancelled(self) -> bool:
        return self.cos < self.bound()


def cancellations(model, inputs, names: list[str], ctx, prepare, eval_mode: bool) -> dict[str, Cancel]:
    """name -> Cancel for each of `names` (at most MAX_TERMS): how much of the gradient at its module's output reaches
    the parameter. Moved along its gradient by EPS of its norm, the output moves by d, and to first order the loss by
    <dL/d out, d> = EPS |p| |grad p|; so EPS |p| |grad p| / (|dL/d out| |d|) is the cosine between what the loss asks
    of that output and what the parameter can change there. Near 1 for a weight (its step follows the output's
    gradient), whatever the gradient's size; near 0 for what a following normalisation cancels (a scalar gain before
    a convolution and BatchNorm: its move only rescales what BatchNorm divides out)."""
    got = _probe(model, inputs, names, ctx, prepare, eval_mode, "a small gradient read where it acts")
    values = dict(zip([*got.sizes, *(f"grad:{p}" for p in got.grads)], got.flat))
    out: dict[str, Cancel] = {}
    at = len(got.sizes) + len(got.grads)
    for n, moved in zip(got.asked, got.moves):
        changes = dict(zip(moved, got.flat[at:at + len(moved)]))
        at += len(moved)
        path = next((a for a in ancestors(owner(n)) if changes.get(a, 0.0) > 0), None)
        lever = got.levers[n]
        if path is None or values.get(f"grad:{path}", 0.0) <= 0 or not lever > 0:
            continue
        out[n] = Cancel(path, EPS * lever / (values[f"grad:{path}"] * changes[path]), got.numel[path])
    return out


@dataclass
class _Probe:
    asked: list        # the names moved, in order
    moves: list        # per asked name: path -> |output move| (device tensors, read in flat)
    sizes: dict        # path -> |output| (device tensors, read in flat)
    grads: dict        # path -> |dL/d output| (device tensors, read in flat)
    numel: dict        # path -> the number of values of the outputs read
    levers: dict       # name -> |p| |grad p| (floats)
    flat: list         # sizes, grads, then every move's values: the one read


def _probe(model, inputs, names: list[str], ctx, prepare, eval_mode: bool, why: str) -> _Probe:
    """One forward and backward on a copy keeping the outputs of the modules holding `names` (at most MAX_TERMS)
    that the loss read, then one forward per name moved alone against its gradient by EPS of its norm."""
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
        read = {p: _read_outputs(outs, first[p]) for p, outs in seen.items() if p in first}
        kept = {p: [seen[p][i] for i in idx] for p, idx in read.items() if idx}
        base = {p: [t.detach() for t in outs] for p, outs in kept.items()}
        sizes = {p: _norm(outs) for p, outs in base.items()}
        grads = {p: _norm([_grad_of(t, seen[p], first[p], i) for t, i in zip(outs, read[p])])
                 for p, outs in kept.items()}
        asked = [n for n in names if params[n].grad is not None and params[n].grad.shape == params[n].shape]
        levers = [widened(params[n].detach()).norm() * widened(params[n].grad.detach()).norm() for n in asked]
        moves = [_moved(work, params[n], inputs, ctx, seen, base, read, state) for n in asked]
    finally:
        for h in hooks:
            h.remove()
    flat = read_back(list(sizes.values()) + list(grads.values()) + levers + [v for m in moves for v in m.values()])
    k = len(sizes) + len(grads)
    numel = {p: sum(t.numel() for t in outs) for p, outs in base.items()}
    return _Probe(asked, moves, sizes, grads, numel, dict(zip(asked, flat[k:k + len(asked)])),
                  flat[:k] + flat[k + len(asked):])


def _grad_of(t, outs: list, first: int, i: int):
    """The gradient of a kept output, or of its recompute inside a reentrant checkpoint (see _read_outputs)."""
    import torch

    g = t.grad if t.grad is not None else outs[first + i].grad
    return g if g is not None else torch.zeros_like(t)


def _read_outputs(outs: list, first: int) -> list[int]:
    """Indices of a module's outputs in the forward (its first `first`) that the loss read: the output got a gradient,
    or its recompute in backward did (inside a reentrant checkpoint the forward runs under no_grad and backward runs
    it again, hooks and all; a review: read at the model's output instead, an exploding bias became small-term)."""
    again = outs[first:] if len(outs) == 2 * first else []
    return [i for i in range(first) if outs[i].grad is not None or (again and again[i].grad is not None)]


def _read(asked, moves, sizes, changed) -> dict[str, Reach]:
    """Each asked name's reach, from the values read back (see reaches)."""
    out: dict[str, Reach] = {}
    at = 0
    for n, moved in zip(asked, moves):
        changes = dict(zip(moved, changed[at:at + len(moved)]))
        at += len(moved)
        moved_at = [Reach(path, changes[path] / sizes[path] / EPS) for path in ancestors(owner(n))   # innermost first
                     if sizes.get(path, 0.0) > 0 and changes.get(path, 0.0) > 0]
        if moved_at:   # its own module's output, or the model's where that moves further (a use of it elsewhere)
            out[n] = max(moved_at[0], moved_at[-1], key=lambda r: r.reach)
    return out


def _moved(work, param, inputs, ctx, seen, base, read, state) -> dict:
    """path -> ‖Δ output‖ (a 0-d device tensor) of each hooked module's outputs the loss read (`read`: their index),
    with `param` moved against its gradient by EPS of its norm for one seeded forward from the buffers the first
    forward started from, then put back."""
    import torch

    from ...core.tracking import run_forward

    with torch.no_grad():
        for n, b in work.named_buffers():
            if n in state and b.shape == state[n].shape:
                b.copy_(state[n])
    grad = param.grad.detach()
    step = grad * (EPS * param.detach().float().norm() / grad.float().norm().clamp_min(1e-30)).to(grad.dtype)
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
            out[p] = _norm([widened(a) - widened(b) for a, b in zip(now, base[p])])
    return out


def _keep(seen: dict, path: str):
    """A forward hook keeping the module's floating-point outputs; those with a graph keep their gradient, so that
    only what the loss reads is compared (a second output the loss never reads moves as the parameter does, and
    made a 7.7e3× loss blow-up look small: a review)."""
    import torch

    from ...core.loss import float_outputs

    def hook(_module, _args, out):
        kept = [t for _, t in float_outputs(out) if t.numel()]
        if torch.is_grad_enabled():
            for t in kept:
                if t.requires_grad:
                    t.retain_grad()
        seen.setdefault(path, []).extend(t if torch.is_grad_enabled() else t.detach() for t in kept)

    return hook


def _norm(tensors):
    """The norm of several outputs together (non-finite values as 0), a 0-d device tensor."""
    import torch

    norms = [widened(t).nan_to_num(0.0, 0.0, 0.0).norm() for t in tensors]
    return torch.stack([v.to(norms[0].device) for v in norms]).norm()
