"""Activation health from the recorded forward: mean/std of module outputs, exact zeros and dead
units after ReLU-family modules (a unit = one output position), saturated fraction after
tanh/sigmoid-family modules. Functional activations (F.relu inside forward) are not modules and are
not seen. A module with too many units 0 for every sample of the batch is re-judged on more,
different samples before it is reported (dead.py): few or alike samples make such zeros chance."""
from __future__ import annotations

import fnmatch
import math

from ...core.module_paths import label
from .dead import RULE, judge


def activation_rows(rec, stats, opts, result, allow_name: str = "--allow", inputs=None, ctx=None) -> list[dict]:
    """One row per module with statistics, in execution order; dead-units/saturated findings added
    to `result` (`allow_name`: the allow option as the caller writes it). With `inputs` and `ctx`,
    flagged modules are re-judged (dead.py) on the model the recorder watched."""
    rows = [_row(name, rec, stats) for name in sorted(rec.acts, key=lambda n: rec.order.get(n, 0))]
    flagged = [r["module"] for r in rows if r["dead_fraction"] is not None and r["dead_fraction"] > opts.dead
               and not _allowed(r["module"], opts)]
    judged = judge(rec.model, inputs, opts, ctx, flagged) if flagged and inputs is not None and ctx is not None else {}
    if flagged and inputs is not None and ctx is not None and len(judged) < len(flagged):
        result.notes.append("dead units of " + ", ".join(sorted(set(flagged) - set(judged))) + " judged on this batch "
                            "only: the re-check on fresh samples could not run (the model raised, or its shapes changed)")
    for row in rows:
        if row["dead_fraction"] is not None:
            _dead(row, judged.get(row["module"]), opts, result, allow_name)
        if row["saturated_fraction"] is not None and row["saturated_fraction"] > opts.saturated:
            _finding(result, opts, allow_name, "saturated", row["module"],
                     f"{row['saturated_fraction']:.1%} of the outputs of {row['type']} are saturated, where its "
                     f"gradient is ~0 (threshold {opts.saturated:.0%})",
                     "scale the pre-activations down (normalisation, smaller initialisation)")
    return rows


def _row(name, rec, stats) -> dict:
    act, got = rec.acts[name], stats.acts[name]
    n = sum(act.n)
    mean = sum(got["s"]) / n if n else None
    var = max(sum(x * x for x in got["ss"]) / n - mean * mean, 0.0) if n else None
    row = {"module": name, "_label": label(name), "type": rec.types.get(name, ""), "shape": act.shape,
           "calls": len(act.n), "mean": mean, "std": math.sqrt(var) if var is not None and math.isfinite(var) else var,
           "zero_fraction": None, "dead_fraction": None, "dead_units": None, "units": None,
           "dead_confirmed": None, "dead_samples": None, "saturated_fraction": None}
    if "relu" in act.kind:
        units, dead = act.units, int(sum(got["dead"]))
        row.update(zero_fraction=int(sum(got["zeros"])) / n if n else None, dead_units=dead, units=units,
                   dead_fraction=dead / units if units else None)
    if "saturating" in act.kind:
        sat = int(sum(got["sat"]))
        if "relu" in act.kind:   # ReLU6: its zero side is the dead-unit question, saturation is the flat top (6)
            sat -= int(sum(got["zeros"]))      # core/recording.py counts y <= 0 | y >= 6; outputs are >= 0
        row["saturated_fraction"] = sat / n if n else None
    return row


def _dead(row, judged, opts, result, allow_name) -> None:
    """The dead-units finding: on the batch alone when it was not re-judged, else by the rule."""
    dead, units = row["dead_units"], row["units"]
    if not units or dead / units <= opts.dead:
        return
    batch = (f"{dead:,} of {units:,} output units ({dead / units:.1%}) of {row['type']} are 0 for every sample "
             "of the batch")
    if judged is None:
        _finding(result, opts, allow_name, "dead-units", row["module"], batch + f" (threshold {opts.dead:.0%})", HINT)
        return
    row.update(dead_confirmed=judged.dead, dead_samples=judged.samples)
    frac = judged.dead / judged.units if judged.units else 0.0
    if frac > opts.dead:
        _finding(result, opts, allow_name, "dead-units", row["module"],
                 f"{batch}, and {judged.dead:,} ({frac:.1%}) stay dead on {judged.samples} samples (the batch and "
                 f"fresh random ones; {RULE}; threshold {opts.dead:.0%})", HINT)
    else:
        result.add("dead-units", "info", row["module"],
                   f"{batch}, but only by chance: {judged.dead:,} ({frac:.1%}) are dead on {judged.samples} samples "
                   f"(the batch and fresh random ones; {RULE}; threshold {opts.dead:.0%})")


HINT = ("the layer before it is pushing these units negative: check its bias/initialisation and the learning "
        "rate; LeakyReLU/GELU do not die")


def _allowed(where, opts) -> bool:
    return any(fnmatch.fnmatchcase(where, pat) for pat in opts.allow)


def _finding(result, opts, allow_name, code, where, message, hint):
    if _allowed(where, opts):
        result.add(code, "info", where, message + f" (accepted by {allow_name})")
    else:
        result.add(code, "warning", where, message, hint)
