"""The layer table: parameters aggregated per module at a depth, in execution order."""
from __future__ import annotations

import math

from ...core.module_paths import label
from .options import STATUS_ORDER

NEVER = 10 ** 9      # sort key of a layer that never ran


def frontier(model, depth: int) -> list[tuple[str, bool]]:
    """The modules shown as layers: (path, own_only). A module with parameters somewhere below it
    is a layer at `depth`, or shallower when no child holds parameters; a shallower module that
    holds parameters of its own next to parameterised children gets an `own` row."""
    mods = dict(model.named_modules())
    has = {n: any(True for _ in m.parameters()) for n, m in mods.items()}
    own = {n: any(True for _ in m.parameters(recurse=False)) for n, m in mods.items()}
    out = []
    for name, mod in mods.items():
        d = name.count(".") + 1 if name else 0
        if d > depth or not has[name]:
            continue
        children_with = any(has.get(f"{name}.{c}" if name else c, False) for c, _ in mod.named_children())
        if d == depth or not children_with:
            out.append((name, False))
        elif own[name]:
            out.append((name, True))
    return out


def layer_rows(layers, rows, order: dict[str, int], modules, known: set | None = None) -> list[dict]:
    """`known`: ids of the parameters the model held before the pass; a module whose only parameters were
    made by the forward itself (self.w = nn.Parameter(...) in forward) has no row: they were not judged,
    and they are not another module's (not tied)."""
    out = []
    for path, own_only in layers:
        if own_only:
            members = [r for r in rows if r["module"] == path]
        else:
            members = [r for r in rows if path == "" or r["name"].startswith(path + ".")]
        first = order.get(path)
        if first is None:   # a container is never called itself: its first child that ran
            sub = [v for k, v in order.items() if k.startswith(path + ".")]
            first = min(sub) if sub else None
        if not members and known is not None and not _shared(modules[path], own_only, known):
            continue
        out.append(_aggregate(path, own_only, members, first, modules))
    out.sort(key=lambda r: r["order"])
    for r in out:
        if r["order"] == NEVER:
            r["order"] = None
    return out


def _aggregate(path, own_only, members, first, modules) -> dict:
    with_grad = [m for m in members if m["grad_norm"] is not None]
    sq = sum(m["grad_norm"] ** 2 for m in with_grad)
    numel = sum(m["numel"] for m in with_grad)
    status = min((m["status"] for m in members), key=STATUS_ORDER.index) if members else "ok"
    if all(m["status"] == "frozen" for m in members):
        status = "frozen"
    if not members and _shared(modules[path], own_only):
        status = "tied"   # its weights are another module's (listed there once): shared, not frozen
    return {
        "layer": path, "own_only": own_only, "_label": label(path) + (" (own)" if own_only else ""),
        "type": type(modules[path]).__name__,
        "params": sum(m["numel"] for m in members), "tensors": len(members),
        "grad_norm": math.sqrt(sq) if with_grad else None,
        "mean_abs_grad": (sum(m["mean_abs_grad"] * m["numel"] for m in with_grad) / numel) if numel else None,
        "max_abs_grad": max((m["max_abs_grad"] for m in with_grad), default=None),
        "weight_norm": math.sqrt(sum(m["weight_norm"] ** 2 for m in members)),
        "status": status, "ran": first is not None, "order": first if first is not None else NEVER,
    }


def _shared(module, own_only: bool, known: set | None = None) -> bool:
    """The module holds parameters, all counted under another module (a tied weight); with `known`, only
    parameters the model held before the pass count."""
    return any(known is None or id(p) in known
               for _, p in module.named_parameters(recurse=not own_only, remove_duplicate=False))


def bar_scale(layer_rows) -> tuple[float, float]:
    """log10 range of the layers' finite, positive mean |grad| (at least one decade wide)."""
    finite = [r["mean_abs_grad"] for r in layer_rows if r["mean_abs_grad"] and math.isfinite(r["mean_abs_grad"])]
    lo, hi = (math.log10(min(finite)), math.log10(max(finite))) if finite else (0.0, 0.0)
    if hi - lo < 1:
        lo = hi - 1
    return lo, hi
