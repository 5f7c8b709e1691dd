"""Does the loss depend on a parameter at all? (gradflow's `invariant`, doctor's update check.)

A bias followed by a batch-statistics normalisation (BatchNorm in train mode, InstanceNorm), or added to
logits before a softmax over the dimension it is constant in, is cancelled exactly: its gradient is zero or
rounding noise, and no optimizer step moves it, by design. Tested by behaviour on a float64 copy: the
parameters are shifted by a random vector (one value per element, so a softmax's invariance to one constant
added to every logit does not count) and the same seeded forward is run; when the loss does not move
(relative change < 1e-9, far above float64 rounding), and would have under that shift (or one scaled up
until it would: _scale), it does not depend on them. All names are shifted together first; a group that
moves the loss is halved, so one real dependence among many cancelled parameters costs a few forwards, not
the verdict of the rest."""
from __future__ import annotations

import math

from ..errors import ModelError, one_line
from . import derived, keep_float64, reach
from .device import widened
from .module_paths import owner
from .tracking import run_forward
from .unreached import RANDOM_DRAWS

LOSS_RTOL = 1e-9     # relative loss change still counted as "did not move" (float64 rounding)
LOSS_RTOL_FLOAT32 = 1e-5   # the same in float32, for a forward that cannot run in float64 (it makes float32
                           # tensors of its own: torchvision RAFT's coordinate grid); rounding is ~1e-7 there
INVARIANT_GRAD_FACTOR = 1e-4   # a gradient below this × the largest of its module's other parameters': a candidate
MAX_SHIFTS = 24      # shifted forwards at most (what is left untested keeps its verdict)
MAX_SCALE = 1e6      # a shift scaled up at most this much where a unit shift cannot tell (_scale)
RESOLUTION = 0.1     # × rtol: a dependence below this fraction of what the shift does at its module is rounding
CANCELS = 1e-6       # a strict name's slope below this × its bound: its gradient sums to nothing (_sums_to_nothing)
ROUNDING = 1e-3      # × what the shift test sees (1e-12 of the loss in float64): a slope above it is no rounding


def small_beside_siblings(norms: dict[str, float | None]) -> set[str]:
    """The names whose gradient norm is below INVARIANT_GRAD_FACTOR × the largest gradient norm of another
    parameter of the same module (norms: name -> gradient norm, None when there is none). What a following
    normalisation or softmax cancels looks like this: the signal reaches the module (a sibling, its weight or
    scale, gets it) and only this parameter's direction sums to nothing. By module, not by name: a
    `bias` beside a `weight` and a learnable affine's `bias` beside its `scale` alike."""
    groups: dict[str, list[tuple[str, float]]] = {}
    for n, v in norms.items():
        if v is not None and math.isfinite(v):
            groups.setdefault(n.rpartition(".")[0], []).append((n, v))
    out = set()
    for group in groups.values():
        if len(group) < 2:
            continue
        values = sorted((v for _, v in group), reverse=True)
        for n, v in group:
            top = values[1] if v == values[0] else values[0]   # the largest of the others
            if top > 0 and v < INVARIANT_GRAD_FACTOR * top:
                out.add(n)
    return out


def small_in_modules(grads: dict, names) -> tuple[set[str], dict[str, float]]:
    """small_beside_siblings over the gradients (name -> tensor or None) of the modules that hold `names`:
    (the small names, every norm read), in one read."""
    from .readback import read_back

    mods = {owner(n) for n in names}
    pool = [n for n, g in grads.items() if g is not None and owner(n) in mods]
    norms = dict(zip(pool, read_back([widened(grads[n].detach()).norm() for n in pool]))) if pool else {}
    return small_beside_siblings(norms), norms


def double(t):
    return t.double() if t.is_floating_point() else t


def float64_copy(module):
    """`module` (a copy) in float64, with the floating tensors its modules keep as plain attributes too: .double()
    casts parameters and buffers only, and a cache a first forward left (mimi's codebook `_embed`) then met a float64
    input ("Input type (torch.FloatTensor) and weight type (torch.DoubleTensor)": doctor's invariance re-check gave
    up, a zoo re-run)."""
    import torch

    module.double()
    for m in module.modules():
        for key, value in list(vars(m).items()):
            if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter) and value.is_floating_point():
                setattr(m, key, value.double())
    return module


def cancelled(work, inputs, names: list[str], loss_fn, ctx, rtol: float = LOSS_RTOL, strict=()) -> set[str]:
    """The `names` the loss does not depend on although they act on what it reads: shifted, the loss does not
    move, though their own module's output moved enough to move it had nothing after it cancelled the move
    (core/reach.py: a following normalisation or softmax removes the shift); see _scale. A parameter that
    moves nothing (LayerNorm over one feature, a weight fed zeros) or moves only what no gradient reaches (the
    unused half of a bidirectional LSTM) keeps its verdict. `work`: a float64 copy in the mode of the run
    (stochastic depth off); `inputs` in float64 (double); loss_fn a fresh ctx.loss() (the same seeded target).
    The names in `strict` (not small beside a sibling: every parameter of their module may be starved) must
    also show the cancellation in the gradient itself (_sums_to_nothing), so a chain that only contracts is
    not asked. Cost: one forward + backward (two when the widened forward fails), per strict name and per name
    the loss cannot tell two calls of its module alone, the shifted forwards of bisect, and those of a second
    bisection of the names the loss cannot tell at a unit shift, each at its own larger shift."""
    from . import phase

    params = dict(work.named_parameters())
    names = [n for n in names if n in params]
    found: set[str] = set()
    with phase.doing(f"shifting {len(names)} parameter(s) on a float64 copy: does the loss depend on them?"):
        for k in range(RANDOM_DRAWS + 1):
            if not names:
                break
            got, names = _in_draw(work, inputs, names, loss_fn, ctx if not k else _Drawn(ctx, k), rtol, strict)
            found |= got
    return found


class _Drawn:
    """The run's context with the k-th other seed (unreached.reached_by_other_draws' draws): a forward that skips
    layers at random (LayerDrop, which stochastic depth off cannot reach) drew differently on the float64 copy and
    skipped the module of a name the judged pass reached (a zoo re-run: wav2vec2-conformer's last key bias, softmax-
    invariant, kept `vanishing-grad` at a batch of 3)."""

    def __init__(self, ctx, k: int):
        from . import seeds

        self.ctx, self.seed = ctx, seeds.other_draw(ctx.seed, k)

    def seeded(self):
        from . import train

        return train.seeded(self.seed)

    def __getattr__(self, name):
        return getattr(self.ctx, name)


def _in_draw(work, inputs, names: list[str], loss_fn, ctx, rtol: float, strict) -> tuple[set[str], list[str]]:
    """cancelled in one draw of the RNG: (the cancelled names, the names its pass gave no gradient: not asked)."""
    base, calls, wide, loss, grads = _base(work, inputs, names, loss_fn, ctx)
    skipped = [n for n in names if n not in grads]
    names = [n for n in names if n in grads]
    if not names:
        return set(), skipped
    test = _ShiftTest(dict(work.named_parameters()), base, loss, ctx, rtol)
    bounds: dict[str, float | None] = {}

    hushed: list[set[str]] = []
    traced: dict = {}   # what silent's pass kept, for derived.bound

    def silent(n: str) -> bool:   # derived.silent's one pass for every name, at the first that needs it
        if not hushed:
            try:
                hushed.append(derived.silent(work, names, calls.count, loss, test.shifted, traced))
            except Exception:   # noqa: BLE001 - not known: each name is measured alone
                hushed.append(set())
                traced.clear()
        return n in hushed[0]

    def bound(n: str) -> float | None:
        if n not in bounds:
            bounds[n] = _widest(calls, work, n, lambda m: test.shifted([n], m), ctx, wide, loss,
                                reach.SEEN * test.seen / MAX_SCALE, silent, traced)
        return bounds[n]

    # what its own float64 gradient already says moves the loss is no cancellation (_scale): asking it in the
    # bisection would only spend the shifts (mnasnet's starved bn1 weights beside its cancelled bn3 biases)
    slopes = {n: test.slope(n, grads.get(n)) for n in names}
    quiet = [n for n in names if slopes[n] < reach.SEEN * test.seen]
    # a slope above float64's rounding along the shift is a dependence, however faint, unless the gradient shows the
    # cancellation's signature at the module (a zoo re-run: zamba2's Mamba A_log moved the loss 3e-10 of itself, under
    # the shift test's 1e-9, and was said cancelled by a normalisation; its float64 gradient is 3e-10 of its weight)
    strict = set(strict) | {n for n in quiet if slopes[n] > ROUNDING * test.seen}
    # a strict name's module must run once: the slope sums every call, the bound sees the first (a call that a
    # norm cancels, then a faint live one, would look cancelled)
    quiet = [n for n in quiet if n not in strict or (calls.once(n) and _sums_to_nothing(slopes[n], bound(n)))]
    # the faintest first: names whose gradient is rounding sit together, so the few real dependences among
    # them (a weight behind a tiny gate) split few groups (timm ghostnetv3: 9 of 39 cancelled biases
    # reached within MAX_SHIFTS in model order, 39 of 39 ordered by slope)
    ordered = sorted(quiet, key=slopes.__getitem__)
    still = bisect(ordered, test.moved)
    scales: dict[str, float] = {}
    for n in (n for n in ordered if n in still):
        scale = _scale(bound(n), test, slopes[n])
        if scale is not None:
            scales[n] = scale
    # each at the scale that would show its own dependence, together: a group whose loss stays is cancelled as a
    # whole, one that moves is halved (a sweep: one forward a name, ~300 names, took gradflow past 10 minutes)
    larger = [n for n, v in scales.items() if v > 1.0]   # (not `wide`: the cast policy bound() reads)
    kept = bisect(larger, lambda group: test.moved(group, {n: scales[n] for n in group})) if larger else set()
    return {n for n, v in scales.items() if v == 1.0} | kept, skipped


def _widest(calls, work, name: str, shifted, ctx, wide, loss, faint: float, silent, traced=None) -> float | None:
    """calls.bound at the module's own output; where that is too faint for any shift to show (below `faint`), the
    bound at the ops inside the nearest ancestor that ran (derived.py), the larger of the two. A cancellation
    after a broadcast (a per-channel time embedding added to a feature map, then a GroupNorm of one channel per
    group: a sweep's tiny diffusers UNet) leaves the module's own output gradient at rounding, while the sum it
    is added into has a live one. What moves nothing (a weight fed zeros) or only what no gradient reaches (a
    discarded half) is 0 at every cut, and keeps its verdict. `silent(name)`: no op inside the ancestor gets a
    gradient from it (derived.silent), so its bound there is 0 and is not measured; `traced`: what that pass kept."""
    b = calls.bound(name, shifted, ctx, wide, loss)
    if b is None or b >= faint or not calls.count.get(owner(name)):
        return b
    at = derived.host(name, calls.count)
    if at is None or silent(name):
        return b
    try:
        inner = derived.bound(work, name, at, loss, shifted, traced)   # `loss` runs the forward under `wide` itself
    except Exception:   # noqa: BLE001 - what cannot be measured keeps the module's own bound
        return b
    return max(b, inner) if inner is not None else b


def _sums_to_nothing(slope: float, bound: float | None) -> bool:
    """A cancellation's signature in the gradient: the loss's gradient reaches the module's output (the bound,
    sum |dL/d out| x |out moved|, is not 0) and sums, along the shift, to rounding (slope below CANCELS x the
    bound). Terms of random signs that do not cancel leave ~1/sqrt(outputs) of the bound (1e-3 for a million
    outputs); a chain that contracts every perturbation (deep sigmoids) scales both alike."""
    return bound is not None and bound > 0 and slope < CANCELS * bound


def _scale(bound: float | None, test, slope: float) -> float | None:
    """The shift of a name the loss did not follow at a unit shift, under which its staying put shows both that the
    shift acts on what the loss reads (its module's output would move the loss, to first order, by SEEN × what the
    test sees: reach.py's bound) and a faint real dependence, if there were one (the parameter's own gradient
    along the shift, `slope`, times the scale, is SEEN × that too): 1.0 where the unit shift showed it already,
    None where no shift can (the verdict stays). A cancellation holds for any shift; a dependence below
    RESOLUTION × rtol of the bound (1e-10 in float64) is not told from rounding. At most MAX_SCALE."""
    if not bound or not math.isfinite(bound):   # None: not known; 0: it moves nothing the loss's gradient
        return None                                # reaches: the verdict stays
    need = reach.SEEN * test.seen
    if slope >= need:   # its gradient says a unit shift moves the loss, and it did not: not a cancellation
        return None
    scale = max(1.0, min(MAX_SCALE, need / max(slope, RESOLUTION * test.rtol * bound)))
    return None if scale * bound < need else scale


class _ShiftTest:
    """Shifts parameters of the copy by seeded random values (× scale) and asks whether the loss moved."""

    def __init__(self, params: dict, base, loss, ctx, rtol: float):
        self.params, self.base, self.loss, self.ctx, self.rtol = params, base, loss, ctx, rtol
        a = float(base)
        if not math.isfinite(a):   # the copy itself went bad (CANINE's masks in float64): it cannot answer
            raise ModelError(f"the loss on the {next(iter(params.values())).dtype} copy is {a}")
        self.seen = rtol * max(abs(a), 1e-3)   # the smallest loss move the test sees, in the loss's units

    def direction(self, name: str):
        """The unit shift of `name` alone (what shifted([name]) adds)."""
        return next(self._draws([name]))[1]

    def slope(self, name: str, grad) -> float:
        """|grad · the unit shift of `name`|: how far its gradient says that shift moves the loss (0 without one)."""
        if grad is None:
            return 0.0
        dot = (grad.conj() * self.direction(name)).sum()   # a complex parameter's: Re <grad, shift> (a review: exit 4)
        return abs(float(dot.real if dot.is_complex() else dot))

    def _draws(self, group):
        """(name, its random shift) for each name of the group, from one generator seeded by the run's seed."""
        import torch

        g = torch.Generator(device=self.params[group[0]].device).manual_seed(self.ctx.seed)
        for n in group:
            p = self.params[n]
            yield n, torch.randn(p.shape, generator=g, device=p.device, dtype=p.dtype)

    def shifted(self, group, measure, scale: float | dict = 1.0):
        """`measure()` with each name of `group` shifted by its draw × `scale` (one for all, or each its own)."""
        import torch

        params = self.params
        with torch.no_grad():
            saved = [params[n].detach().clone() for n in group]
            for n, d in self._draws(group):
                params[n].add_(d * (scale[n] if isinstance(scale, dict) else scale))
            try:
                return measure()
            finally:
                for n, v in zip(group, saved):
                    params[n].copy_(v)

    def moved(self, group, scale: float | dict = 1.0) -> bool:
        import torch

        with torch.no_grad():
            a, b = torch.stack([self.base, self.shifted(group, self.loss, scale)]).tolist()
        return not abs(a - b) <= self.seen     # a NaN shifted loss moved


def _base(work, inputs, names, loss_fn, ctx):
    """(the loss, its modules' first calls and gradients, the cast policy, the loss function of that policy,
    the names' float64 gradients):
    one forward + backward, with casts widened on a float64 copy (keep_float64), and as written when that
    forward or its backward fails (code that reads a float32's bits; an in-place write to a cast)."""
    import contextlib

    import torch

    policies = [contextlib.nullcontext]
    if next(work.parameters()).dtype == torch.float64:
        policies.insert(0, keep_float64.kept)
    for k, wide in enumerate(policies):
        def loss(wide=wide):
            with ctx.seeded(), wide():
                out = run_forward(work, inputs, phase=f"forward (re-check on a {_dtype(work)} copy)")
                return widened(loss_fn(out)).reshape(())

        try:
            with torch.enable_grad(), reach.FirstCalls(work, names) as calls:
                base = loss()
                if base.requires_grad:
                    torch.autograd.backward(base)
            params = dict(work.named_parameters())
            # the gradients themselves, not clones: they are taken off the parameters below, never zeroed in place
            # (a clone held them twice at once: 2.3 GB more on torchvision vit_l_16's float64 copy)
            grads = {n: params[n].grad.detach() for n in names if params[n].grad is not None}
            return base.detach(), calls, wide, loss, grads
        except ModelError:
            if k == len(policies) - 1:
                raise
        except RuntimeError as exc:
            if k == len(policies) - 1:
                raise ModelError(f"the copy's backward failed: {one_line(exc)}") from exc
        finally:
            for p in work.parameters():   # not the model's own zero_grad, which may zero in place
                p.grad = None
    raise AssertionError("unreachable")


def _dtype(work) -> str:
    return str(next(work.parameters()).dtype).replace("torch.", "")


def bisect(names: list[str], moved) -> set[str]:
    """The names whose shift leaves the loss where it was: a group that does not move is cancelled as a
    whole, one that moves is halved (at most MAX_SHIFTS calls of `moved`)."""
    out: set[str] = set()
    stack, shifts = [list(names)] if names else [], 0
    while stack and shifts < MAX_SHIFTS:
        group = stack.pop()
        shifts += 1
        if not moved(group):
            out |= set(group)
        elif len(group) > 1:
            half = len(group) // 2
            stack += [group[half:], group[:half]]
    return out
