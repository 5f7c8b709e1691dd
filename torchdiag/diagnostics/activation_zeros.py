"""Where an all-zero output comes from (activations' `dead-activations`), judged by what the modules do.

An output that is exactly zero is said once, at its origin: the innermost module whose output is zero while its
input was not. The modules after it that only pass the zeros on (a dropout, an activation, a drop-path of a zero
branch) are named in the same finding, not each a finding of its own. At the origin, the cause is asked of the
module itself: run again alone on a copy, on its first call's arguments, with its all-zero parameters drawn at
random instead. If the output is then no longer zero, those parameters are a zero-initialised gate (timm's
zero-init residual: the last norm of a block with its weight at 0; a zero-initialised last convolution), by
design at initialisation and moved by training: `zero-init` (info). A module without such parameters (a ReLU
whose inputs are all negative), or whose output stays zero, keeps the warning."""
from __future__ import annotations

DEAD = 0.99   # an output with at least this fraction of exact zeros is "zero"


def origins(rows: list[dict], zero_in: dict[str, bool]) -> list[tuple[dict, list[str]]]:
    """(origin row, names of the modules after it that pass its zeros on) for each zero output's origin. `rows`:
    the activation rows in execution order (a child's output before its parent's); `zero_in`: module name ->
    its first floating input was zero (absent: not known)."""
    zero = [r for r in rows if _is_zero(r)]
    names = {r["name"] for r in zero}
    # an origin: its input was not zero (or not known), and no module inside it is an origin already (a parent
    # that holds the origin, a ConvNormAct around its norm)
    first = [r for r in zero if not zero_in.get(r["name"], False)]
    inner = [r for r in first if not any(o["name"].startswith(r["name"] + ".") for o in first)]
    out: list[tuple[dict, list[str]]] = [(r, []) for r in inner]
    # the rest go with the origin inside them (a parent) or around them (a norm's own activation, which runs and
    # returns before the norm does), else with the nearest origin run before them (a drop-path after the branch)
    order = {r["name"]: i for i, r in enumerate(rows)}
    for r in zero:
        if any(r is o for o, _ in out):
            continue
        n = r["name"]
        related = [o for o in out if o[0]["name"].startswith(n + ".") or n.startswith(o[0]["name"] + ".")]
        before = related or [o for o in out if order[o[0]["name"]] <= order[n]]
        if before:
            before[-1][1].append(n)
    return [(o, [n for n in passed if n in names]) for o, passed in out]


def _is_zero(row: dict) -> bool:
    return row["name"] != "(model)" and row["zero_fraction"] is not None and row["zero_fraction"] >= DEAD \
        and row["elements"] >= 16


def zero_gate(module, args, seed: int = 0) -> list[str]:
    """The module's all-zero floating parameters that, drawn at random on a copy, make its output on its first
    call's arguments no longer zero and a function of them (another input, the first one moved by noise, gives
    another output: a zero bias drawn alone gives a constant): each alone where one does (a norm's weight, not its
    bias), else all of them together; [] when it has none, they do not, or the copy cannot run alone."""
    zeros = [n for n, p in module.named_parameters() if p.is_floating_point() and p.numel() and not bool(p.any())]
    if not zeros or args is None:
        return []
    alone = [n for n in zeros if _opens(module, args, [n], seed)]
    return alone or (zeros if len(zeros) > 1 and _opens(module, args, zeros, seed) else [])


def _opens(module, args, names: list[str], seed: int) -> bool:
    import copy

    import torch

    from ..core.tracking import first_tensor

    try:
        work = copy.deepcopy(module)
        params = dict(work.named_parameters())
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for n in names:
                p = params[n]
                p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64).to(p.device, p.dtype))
            out = first_tensor(work(*args))
            moved = first_tensor(work(*_moved(args, g)))
    except Exception:   # noqa: BLE001 - what cannot run alone is not known to be gated: the warning stays
        return False
    if out is None or moved is None or not out.is_floating_point() or out.numel() == 0 or out.shape != moved.shape:
        return False
    return float((out == 0).double().mean()) < DEAD and not bool(torch.equal(out, moved))


def _moved(args, g):
    """args with its first floating tensor moved by noise of its own spread."""
    import torch
    from torch.utils._pytree import tree_flatten, tree_unflatten

    leaves, spec = tree_flatten(args)
    for i, a in enumerate(leaves):
        if isinstance(a, torch.Tensor) and a.is_floating_point() and a.numel():
            spread = float(a.double().std()) if a.numel() > 1 else 1.0
            noise = torch.randn(a.shape, generator=g, dtype=torch.float64).to(a.device, a.dtype)
            leaves[i] = a + noise * (spread or 1.0)
            break
    return tree_unflatten(leaves, spec)
