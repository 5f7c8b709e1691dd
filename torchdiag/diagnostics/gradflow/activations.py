"""Activation health from the recorded forward: mean/std of module outputs, exact zeros and dead
units after ReLU-family modules (a unit = one output position; dead = zero for every sample of the
batch), saturated fraction after tanh/sigmoid-family modules. Functional activations (F.relu inside
forward) are not modules and are not seen."""
from __future__ import annotations

import fnmatch
import math

from .names import label


def activation_rows(rec, stats, opts, result, allow_name: str = "--allow") -> list[dict]:
    """One row per module with statistics, in execution order; dead-units/saturated findings added
    to `result` (`allow_name`: the allow option as the caller writes it)."""
    rows = []
    for name in sorted(rec.acts, key=lambda n: rec.order.get(n, 0)):
        act, got = rec.acts[name], stats.acts[name]
        n = sum(act.n)
        mean = sum(got["s"]) / n if n else None
        var = max(sum(x * x for x in got["ss"]) / n - mean * mean, 0.0) if n else None
        row = {"module": name, "_label": label(name), "type": rec.types.get(name, ""), "shape": act.shape,
               "calls": len(act.n), "mean": mean, "std": math.sqrt(var) if var is not None and math.isfinite(var) else var,
               "zero_fraction": None, "dead_fraction": None, "dead_units": None, "units": None,
               "saturated_fraction": None}
        if "relu" in act.kind:
            _dead(row, int(sum(got["zeros"])), int(sum(got["dead"])), n, act.units, opts, result, allow_name)
        if "saturating" in act.kind:
            sat = int(sum(got["sat"]))
            row["saturated_fraction"] = sat / n if n else None
            if n and sat / n > opts.saturated:
                _finding(result, opts, allow_name, "saturated", name,
                         f"{sat / n:.1%} of the outputs of {row['type']} are saturated, where its gradient is ~0 "
                         f"(threshold {opts.saturated:.0%})",
                         "scale the pre-activations down (normalisation, smaller initialisation)")
        rows.append(row)
    return rows


def _dead(row, zeros, dead, n, units, opts, result, allow_name) -> None:
    row.update(zero_fraction=zeros / n if n else None, dead_units=dead, units=units, dead_fraction=dead / units if units else None)
    if units and dead / units > opts.dead:
        _finding(result, opts, allow_name, "dead-units", row["module"],
                 f"{dead:,} of {units:,} output units ({dead / units:.1%}) of {row['type']} are 0 "
                 f"for every sample of the batch (threshold {opts.dead:.0%})",
                 "the layer before it is pushing these units negative: check its bias/initialisation "
                 "and the learning rate; LeakyReLU/GELU do not die")


def _finding(result, opts, allow_name, code, where, message, hint):
    if any(fnmatch.fnmatchcase(where, pat) for pat in opts.allow):
        result.add(code, "info", where, message + f" (accepted by {allow_name})")
    else:
        result.add(code, "warning", where, message, hint)
