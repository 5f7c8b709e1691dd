"""Where an all-zero output comes from (activations' `dead-activations`), judged by what the modules do.

An output that is exactly zero is said once, at its origin: the innermost module with a call whose output was zero
while its floating inputs, read before the forward (an in-place ReLU overwrites them), were not. The modules that
only pass the zeros on (a dropout, an activation, a drop-path of a zero branch: zero output from zero input), and
the modules that hold an origin, are named in its finding; a zero output that no origin accounts for is a finding
of its own, never dropped.

At the origin, the cause is asked of the module itself: its all-zero parameters that train (requires_grad) must get
a gradient from a random projection of the model's output (one backward, in eval mode, for all origins: a zero
weight whose output a ReLU then zeroes gets none and never trains); on a copy of the module in eval mode, on its
first such call's arguments (and keywords), the copy as it is must give the zero output again; and drawn at random,
alone or together, those parameters must make the output not zero and a function of the input (the input moved by
noise moves it). Then they are a zero-initialised gate (timm's zero-init residual: a block's last norm
with its weight at 0), by design at initialisation: `zero-init` (info). A call with no floating input (a learned
position-bias table read by index) has no input to follow: a zero-initialised table that trains is such a gate too. Otherwise (a ReLU whose inputs are all
negative, a zero bias inside a dead block, a frozen or untrainable zero layer) the warning stays. A module with
more than MAX_ELEMENTS parameter elements or MAX_TRIED zero parameters is not copied to be asked."""
from __future__ import annotations

from ...core.device import widened

DEAD = 0.99              # an output with at least this fraction of exact zeros is "zero"
MAX_ELEMENTS = 10_000_000
MAX_TRIED = 8


def origins(rows: list[dict], made: set[str]) -> list[tuple[dict, list[str]]]:
    """(origin row, the other zero outputs it accounts for) for each origin. `rows`: the activation rows in
    execution order (a child's output before its parent's); `made`: the modules with a call that made zeros from
    inputs that were not zero."""
    zero = [r for r in rows if _is_zero(r)]
    first = [r for r in zero if r["name"] in made]
    # the innermost: a parent around an origin (a ConvNormAct around its norm) goes with it
    inner = [r for r in first if not any(o["name"].startswith(r["name"] + ".") for o in first)]
    out: list[tuple[dict, list[str]]] = [(r, []) for r in inner]
    order = {r["name"]: i for i, r in enumerate(rows)}
    for r in zero:
        if any(r is o for o, _ in out):
            continue
        n = r["name"]
        # the origin inside it or around it (a norm's own activation runs and returns before the norm does), else
        # the nearest origin run before it (a drop-path after the branch); none: a finding of its own
        related = [o for o in out if o[0]["name"].startswith(n + ".") or n.startswith(o[0]["name"] + ".")]
        before = related or [o for o in out if order[o[0]["name"]] <= order[n]]
        if before:
            before[-1][1].append(n)
        else:
            out.append((r, []))
    return out


def _is_zero(row: dict) -> bool:
    return row["name"] != "(model)" and row["zero_fraction"] is not None and row["zero_fraction"] >= DEAD \
        and row["elements"] >= 16


def zero_parameters(module) -> list[str]:
    """Its all-zero floating parameters that train (requires_grad), by their names in it."""
    return [n for n, p in module.named_parameters() if p.requires_grad and p.is_floating_point() and p.numel()
            and not bool(p.any())]


STEPS = 3                # steps of the short run on a copy that lets a gradient through gates after the zero one
STEP = 1e-3              # the largest gradient's parameter moves this far (its norm) per step, the others in proportion


def reached(model, inputs, names: list[str], ctx, seed: int = 0) -> set[str]:
    """The `names` (parameters of `model`) a gradient reaches: one forward in eval mode and a backward of a random
    projection of the model's output, with autograd.grad (no .grad written; the model put back as it was). A zero
    weight whose output a ReLU then zeroes gets none: it never trains. One that gets none only because another
    zero-initialised gate sits after it (timm's GlobalContext: its fc2 at 0, then the block's last BatchNorm gain at
    0: a sweep's gcresnext50ts warned 16 blocks) is reached within a short run on a copy (_after_steps). Empty when
    the pass cannot run."""
    import torch

    from ...core.guard import leave_no_trace

    params = dict(model.named_parameters())
    wanted = [n for n in names if n in params]
    if not wanted:
        return set()
    try:
        with leave_no_trace(model), torch.enable_grad(), ctx.seeded():
            model.eval()
            found = _reached_now(model, inputs, params, wanted, seed)
    except Exception:   # noqa: BLE001 - unknown: the warnings stay
        return set()
    rest = [n for n in wanted if n not in found]
    return found | (_after_steps(model, inputs, rest, ctx, seed) if rest else set())


def _reached_now(model, inputs, params: dict, wanted: list[str], seed: int, step: bool = False) -> set[str]:
    """One forward and a backward of the random projection: the `wanted` with a finite gradient that is not all 0.
    With `step`, a plain gradient step on every trainable parameter follows, scaled so the largest moves STEP."""
    import torch

    from ...core.loss import primary_output

    out, _ = primary_output(inputs.call(model))
    if not (isinstance(out, torch.Tensor) and out.is_floating_point() and out.requires_grad):
        return set()
    r = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed)).to(out.device, out.dtype)
    names = list(params) if step else wanted
    grads = dict(zip(names, torch.autograd.grad((out * r).sum(), [params[n] for n in names], allow_unused=True)))
    if step:   # a plain gradient step whose largest move is STEP: a parameter moves as its gradient says (a review:
        with torch.no_grad():   # each moved STEP whatever its gradient, a 1e-6 one flipped a shortcut and woke a dead
            live = {n: g for n, g in grads.items()   # block that 2,000 SGD steps leave dead)
                    if g is not None and bool(torch.isfinite(g).all()) and bool(g.any())}
            top = max((float(g.norm()) for g in live.values()), default=0.0)
            for n, g in live.items():
                params[n].sub_(g * (STEP / top))
    return {n for n in wanted if grads[n] is not None and bool(grads[n].any()) and bool(torch.isfinite(grads[n]).all())}


def _after_steps(model, inputs, wanted: list[str], ctx, seed: int) -> set[str]:
    """The `wanted` a gradient reaches within STEPS steps of the random projection on a copy in eval mode (none
    when no copy fits or the pass cannot run)."""
    import torch

    from ...core.train import train_copy

    try:
        work = train_copy(model, "to see whether a short run lets a gradient reach its zero parameters")
    except Exception:   # noqa: BLE001 - no copy (NoRoom among them): the warnings stay
        return set()
    params = {n: p for n, p in work.named_parameters() if p.requires_grad}
    wanted = [n for n in wanted if n in params]
    found: set[str] = set()
    try:
        with torch.enable_grad(), ctx.seeded():
            work.eval()
            for _ in range(STEPS):
                found |= _reached_now(work, inputs, params, [n for n in wanted if n not in found], seed, step=True)
                if len(found) == len(wanted):
                    break
    except Exception:   # noqa: BLE001 - unknown: the warnings stay
        pass
    return found


def zero_gate(module, args, kwargs, trains: set[str], seed: int = 0) -> list[str]:
    """The module's zero-initialised gate (see the module's doc) among `trains` (its zero parameters a gradient of
    the model reaches): those that, drawn at random, open its output, each alone where one does, else together; []
    otherwise."""
    import copy

    params = dict(module.named_parameters())
    tried = [n for n in zero_parameters(module) if n in trains]
    if not tried or len(tried) > MAX_TRIED or sum(p.numel() for p in params.values()) > MAX_ELEMENTS:
        return []
    try:
        work = copy.deepcopy(module).eval()
        out = _run(work, args, kwargs)
        if out is None or not _all_zero(out):
            return []   # not the zero output seen (its input changed in place, a state): not asked
        alone = [n for n in tried if _opens(work, args, kwargs, [n], seed)]
        return alone or (tried if len(tried) > 1 and _opens(work, args, kwargs, tried, seed) else [])
    except Exception:   # noqa: BLE001 - what cannot run alone is not known to be gated: the warning stays
        return []


def detached(obj):
    """obj with every tensor in it detached and cloned (a forward may change its input in place)."""
    import torch
    from torch.utils._pytree import tree_map

    return tree_map(lambda a: a.detach().clone() if isinstance(a, torch.Tensor) else a, obj)


def _run(work, args, kwargs):
    from ...core.tracking import first_tensor

    out = first_tensor(work(*detached(args), **detached(kwargs)))
    return out if out is not None and out.is_floating_point() and out.numel() else None


def _all_zero(out) -> bool:
    return float(widened(out.detach() == 0).mean()) >= DEAD


def _opens(work, args, kwargs, names: list[str], seed: int) -> bool:
    """Drawn at random (then put back to zero), do `names` make the output not zero and follow the input? A call with
    no floating input has none to follow: its output is a function of its parameters alone (transformers'
    SwinRelativePositionBias, `forward(self)` reading a zero-initialised table), and not zero is enough."""
    import torch

    params = dict(work.named_parameters())
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n in names:
            p = params[n]
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64).to(p.device, p.dtype))
        try:
            out = _run(work, args, kwargs)
            moved = _run(work, *_moved((args, kwargs), g))
        finally:
            for n in names:
                params[n].zero_()
    if out is None or _all_zero(out):
        return False
    if not reads_input(args, kwargs):
        return True
    return moved is not None and out.shape == moved.shape and not bool(torch.equal(out, moved))


def reads_input(args, kwargs) -> bool:
    """The call was given a floating tensor (a module that reads only its own parameters was not)."""
    import torch
    from torch.utils._pytree import tree_leaves

    return any(isinstance(a, torch.Tensor) and a.is_floating_point() and a.numel() for a in tree_leaves((args, kwargs)))


def _moved(call, g):
    """(args, kwargs) with the first floating tensor in them moved by noise of its own spread."""
    import torch
    from torch.utils._pytree import tree_flatten, tree_unflatten

    leaves, spec = tree_flatten(call)
    for i, a in enumerate(leaves):
        if isinstance(a, torch.Tensor) and a.is_floating_point() and a.numel():
            spread = float(widened(a).std()) if a.numel() > 1 else 1.0
            noise = torch.randn(a.shape, generator=g, dtype=torch.float64).to(a.device, a.dtype)
            leaves[i] = a + noise * (spread or 1.0)
            break
    return tree_unflatten(leaves, spec)
