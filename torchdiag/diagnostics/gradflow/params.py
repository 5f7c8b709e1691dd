"""Per-parameter rows: the statistics read back, and a status (worst first): non-finite-grad,
no-grad (unused | detached), zero-grad, exploding-grad, vanishing-grad, frozen, ok."""
from __future__ import annotations

import fnmatch
import math

from .causes import why
from .names import owner
from .stats import L1, L2, LINF, WEIGHT


def param_rows(params: dict, pas, stats, modules, opts) -> list[dict]:
    rows = []
    for n, p in params.items():
        vals = stats.params[n]
        row = {"name": n, "module": owner(n), "shape": list(p.shape), "numel": p.numel(),
               "requires_grad": p.requires_grad, "weight_norm": vals[WEIGHT], "grad_norm": None,
               "grad_weight_ratio": None, "mean_abs_grad": None, "max_abs_grad": None,
               "nan": 0, "inf": 0, "status": "ok", "reason": None, "allowed": False}
        if pas.grads[n] is not None:
            nan, inf = stats.nonfinite.get(n, (0, 0))
            gnorm = vals[L2]
            row.update(grad_norm=gnorm, mean_abs_grad=vals[L1] / max(p.numel(), 1), max_abs_grad=vals[LINF],
                       nan=nan, inf=inf)
            if vals[WEIGHT] > 0 and math.isfinite(gnorm):
                row["grad_weight_ratio"] = gnorm / vals[WEIGHT]
            row["status"] = status(row, opts)
        elif not p.requires_grad:
            row["status"] = "frozen"
        else:
            row["status"] = "no-grad"
            row["reason"], row["why"] = why(n, pas.rec, pas.reach, modules)
        row["allowed"] = row["status"] not in ("ok", "frozen") and any(fnmatch.fnmatchcase(n, pat) for pat in opts.allow)
        rows.append(row)
    return rows


def status(row, opts) -> str:
    if row["nan"] or row["inf"]:
        return "non-finite-grad"
    if row["max_abs_grad"] == 0:
        return "zero-grad"
    ratio = row["grad_weight_ratio"]
    if row["grad_norm"] > opts.exploding or (ratio is not None and ratio > opts.exploding_ratio):
        return "exploding-grad"
    if (ratio if ratio is not None else row["grad_norm"]) < opts.vanishing:
        return "vanishing-grad"
    return "ok"
