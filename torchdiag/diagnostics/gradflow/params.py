"""Per-parameter rows: the statistics read back, and a status (worst first): non-finite-grad,
no-grad (unused | detached), zero-grad, exploding-grad, vanishing-grad, frozen, ok."""
from __future__ import annotations

import fnmatch
import math

from ...core.device import widened
from ...core.module_paths import owner
from ...core.unreached import NOT_REACHED, why
from .design import is_tiny, rms
from .stats import L1, L2, LINF, WEIGHT

ORTHOGONAL = 1e-3   # |cos(gradient, weight)| at or below this: a candidate for the scale test (recheck.py)


def param_rows(params: dict, pas, stats, modules, opts, lr: float = 1e-3, chosen: bool = False) -> list[dict]:
    """`lr`: the run's learning rate, for the update size of a tiny-by-construction parameter. `chosen`: the
    inputs are a source's default, so a module they never ran is not-reached (core/unreached.py), not no-grad."""
    rows = []
    for n, p in params.items():
        vals = stats.params[n]
        row = {"name": n, "module": owner(n), "shape": list(p.shape), "numel": p.numel(),
               "requires_grad": p.requires_grad, "weight_norm": vals[WEIGHT], "grad_norm": None,
               "grad_weight_ratio": None, "mean_abs_grad": None, "max_abs_grad": None,
               "nan": 0, "inf": 0, "status": "ok", "reason": None, "allowed": False, "design": None, "rechecked": False,
               "scale_invariant": pas.rec.feeds_norm(owner(n)), "orthogonal": None}
        if pas.grads[n] is not None:
            nan, inf = stats.nonfinite.get(n, (0, 0))
            gnorm = vals[L2]
            row.update(grad_norm=gnorm, mean_abs_grad=vals[L1] / max(p.numel(), 1), max_abs_grad=vals[LINF],
                       nan=nan, inf=inf)
            if vals[WEIGHT] > 0 and math.isfinite(gnorm):
                row["grad_weight_ratio"] = gnorm / vals[WEIGHT]
            row["status"] = status(row, opts, lr)
            row["design"] = design_note(row, opts, lr)
        elif not p.requires_grad:
            row["status"] = "frozen"
        elif p.numel() == 0:    # an empty tensor, used or not: nothing to judge
            row["status"] = "ok"
        else:
            row["reason"], row["why"] = why(n, pas.rec, pas.reach, modules)
            row["status"] = NOT_REACHED if chosen and row["reason"] == "unused" else "no-grad"
        row["allowed"] = row["status"] not in ("ok", "frozen") and any(fnmatch.fnmatchcase(n, pat) for pat in opts.allow)
        rows.append(row)
    _orthogonal(rows, params, pas.grads)
    return rows


def _orthogonal(rows, params, grads) -> None:
    """cos(gradient, weight) of each row the thresholds call exploding (one read; none on a healthy model):
    near 0 for a weight whose scale the loss ignores (d/da L(a w) = <g, w>), the candidates recheck.py asks
    directly whether they are scale-invariant. Not a verdict alone: a sparse gradient (an embedding's rows
    not in the batch) or any gradient of a tensor with millions of elements is near-orthogonal by chance."""
    import torch

    from ...core.readback import read_back

    cands = [r for r in rows if r["status"] == "exploding-grad" and not r["scale_invariant"] and not is_tiny(r)
             and r["grad_weight_ratio"] is not None and _plain(params[r["name"]], grads[r["name"]])]
    if not cands:
        return
    dots = read_back([torch.dot(widened(grads[r["name"]].detach().reshape(-1)),
                                widened(params[r["name"]].detach().reshape(-1))) for r in cands])
    for r, dot in zip(cands, dots):
        r["orthogonal"] = dot / (r["grad_norm"] * r["weight_norm"])


def mark_scale_invariant(row, opts, lr: float) -> None:
    """A row measured scale-invariant (recheck.py): no longer exploding, with the info note why."""
    row["scale_invariant"], row["allowed"] = True, False
    row["status"] = status(row, opts, lr)
    row["design"] = design_note(row, opts, lr)


def _plain(p, g) -> bool:
    """A whole local tensor (not a DTensor shard, whose dot would be partial) of the weight's shape."""
    import torch

    return (g is not None and type(p) in (torch.nn.Parameter, torch.Tensor) and type(g) is torch.Tensor
            and g.shape == p.shape and p.is_floating_point())


def status(row, opts, lr: float = 1e-3) -> str:
    """The status of a parameter that got a gradient. How big is too big depends on how the
    parameter is built (design.py): a tiny-by-construction value is judged by its gradient alone
    (grad/weight of a 1e-6 layer scale is huge for any ordinary gradient): its norm, and the update
    size, lr × max |grad|, which must stay below 1 (an ordinary weight's scale); a weight feeding a
    batch-statistics normalisation is scale-invariant: its gradient is orthogonal to w and grows as
    1/|w|, so a step grows |w| and the ratio corrects itself: neither number makes it exploding."""
    if row["numel"] == 0:       # an empty tensor (DINOv3 without register tokens): nothing to judge
        return "ok"
    if row["nan"] or row["inf"]:
        return "non-finite-grad"
    if row["max_abs_grad"] == 0:
        return "zero-grad"
    ratio = None if is_tiny(row) else row["grad_weight_ratio"]
    norm_limit, ratio_limit = opts.exploding, opts.exploding_ratio
    if row["scale_invariant"] and ratio is not None:
        norm_limit, ratio_limit = float("inf"), float("inf")
    if row["grad_norm"] > norm_limit or (ratio is not None and ratio > ratio_limit):
        return "exploding-grad"
    if is_tiny(row) and lr * row["max_abs_grad"] > 1:
        return "exploding-grad"
    if (ratio if ratio is not None else row["grad_norm"]) < opts.vanishing:
        return "vanishing-grad"
    return "ok"


def design_note(row, opts, lr: float = 1e-3) -> dict | None:
    """{kind, why} for a parameter the plain thresholds would have called exploding but whose
    construction explains the number (it stays `ok`; an info finding says why)."""
    raw = row["grad_weight_ratio"]
    if row["status"] != "ok" or raw is None:
        return None
    if is_tiny(row) and raw > opts.exploding_ratio:
        return _note("tiny-by-construction", f"RMS {rms(row):.1e}; judged by its gradient "
                f"(norm {row['grad_norm']:.3g} ≤ {opts.exploding:g}; one step at lr {lr:g} moves it by at most "
                f"{lr * row['max_abs_grad']:.2g}); grad/weight {raw:.3g} says nothing about it")
    if row["scale_invariant"] and (row["grad_norm"] > opts.exploding or raw > opts.exploding_ratio):
        after = raw / (1 + (lr * raw) ** 2)
        how = (f"the loss ignores its scale (measured on a copy: doubled, the loss stays and its gradient halves; "
               f"cos(gradient, weight) {row['orthogonal']:.1e})"
               if row.get("orthogonal") is not None else "feeds a batch-statistics normalisation, so the loss ignores its scale")
        return _note("scale-invariant", f"{how}: its gradient (norm {row['grad_norm']:.3g}, grad/weight {raw:.3g}) is "
                     f"orthogonal to it and grows as 1/|w|; a step grows |w| instead, and one step at lr {lr:g} brings "
                     f"grad/weight to {after:.3g}")
    return None


def _note(kind: str, why: str) -> dict:
    return {"kind": kind, "why": why}
