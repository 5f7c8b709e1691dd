"""Display-only row keys (`_`-prefixed: shown on the console, never in JSON) and the tables.

Kept apart from the checks: nothing here decides a status or a finding."""
from __future__ import annotations

import math

from ...results import Column, Table
from .options import STATUS_SEVERITY
from .underflow import note as underflow_note


def log_bar(value, lo, hi, width=12) -> str:
    from ...fmt import bar

    if value is None or not math.isfinite(value):
        return "!" * 3 if value is not None else ""
    if value <= 0:
        return "·"
    frac = 1.0 if hi <= lo else (math.log10(value) - lo) / (hi - lo)
    return bar(max(frac, 0.02), width).rstrip()


def style(status, allowed=False):
    if allowed:
        return "dim"
    return {"error": "red", "warning": "yellow"}.get(STATUS_SEVERITY.get(status) or "", None)


def decorate(rows, layer_rows, act_rows, scale, findings) -> None:
    for r in rows:
        r["_shape"] = "x".join(str(d) for d in r["shape"]) or "scalar"
        r["_status"] = r["status"] + (" (allowed)" if r["allowed"] else "")
        r["_style"] = style(r["status"], r["allowed"])
        r.pop("why", None)
    for r in layer_rows:
        r["_bar"] = log_bar(r["mean_abs_grad"], *scale)
        r["_style"] = "dim" if not r["ran"] else style(r["status"])
    warned = {f.where for f in findings if f.code in ("dead-units", "saturated") and f.severity != "info"}
    for r in act_rows:
        r["_style"] = "yellow" if r["module"] in warned else None


def tables(result, rows, layer_rows, act_rows, scale, opts, reduced: str | None = None) -> None:
    """`reduced`: the reduced dtype of the pass (underflow.py), which adds an underflow column."""
    lo, hi = scale
    under = [Column("underflow", "underflow", "pct")] if reduced else []
    note = f"; {underflow_note(reduced)}" if reduced else ""
    result.tables.append(Table("layers", "Gradient flow by layer (execution order)", [
        Column("_label", "layer"), Column("type", "type"), Column("params", "params", "count"),
        Column("grad_norm", "grad norm", "float"), Column("mean_abs_grad", "mean |grad|", "float"),
        Column("max_abs_grad", "max |grad|", "float"), Column("_bar", "mean |grad| (log)", "bar"), *under,
        Column("status", "status", "status")], layer_rows,
        note=f"depth ≤ {opts.depth}; bar: mean |grad| on a log scale from {10 ** lo:.1e} to {10 ** hi:.1e}"
             + ("; dim rows never ran in forward" if any(not r["ran"] for r in layer_rows) else "") + note))
    ptable = Table("params", "Parameters", [
        Column("name", "parameter"), Column("_shape", "shape"), Column("grad_norm", "grad norm", "float"),
        Column("weight_norm", "weight norm", "float"), Column("grad_weight_ratio", "grad/weight", "float"),
        Column("mean_abs_grad", "mean |grad|", "float"), Column("max_abs_grad", "max |grad|", "float"), *under,
        Column("_status", "status", "status")], rows)
    if not opts.all:   # brief by default: layers at the chosen depth; flagged parameters are findings
        ptable.show = False
        result.notes.append(f"{len(rows)} parameter tensors: --all prints the per-parameter table (always in --json, "
                            "key 'params'); flagged ones are listed below")
    result.tables.append(ptable)
    m = opts.saturation_margin
    atable = Table("activations", "Activation health (module outputs, this batch)", [
        Column("_label", "module"), Column("type", "type"), Column("shape", "output"),
        Column("mean", "mean", "float"), Column("std", "std", "float"),
        Column("zero_fraction", "zeros", "pct"), Column("dead_fraction", "dead units", "pct"),
        Column("saturated_fraction", "saturated", "pct")], act_rows,
        note="dead unit: an output position that is exactly 0 for every sample of the batch (a flagged module is "
             "re-judged on 16 fresh samples: dead_confirmed in --json); "
             f"saturated: tanh |y| > {1 - m:g}, sigmoid outside [{m:g}, {1 - m:g}], hardtanh at its bounds")
    if not opts.all:   # brief: only the modules with a finding; a one-line summary says the rest (activation_line)
        brief(atable, result.findings)
    result.tables.append(atable)


def brief(table, findings) -> None:
    """Console rows of the activation table: the modules a dead-units or saturated finding names (any
    severity); none of them: the table is not shown. JSON keeps every row."""
    named = {f.where for f in findings if f.code in ACT_CODES}
    for r in table.rows:
        if r["module"] not in named:
            r["_hidden"] = True
    table.show = bool(named)


ACT_CODES = ("dead-units", "saturated")


def activation_line(act_rows, opts) -> tuple[str, str]:
    """The summary line of activation health: how many module outputs, the worst dead-unit and saturated
    fractions and where."""
    text = f"{len(act_rows)} module output{'s' * (len(act_rows) != 1)}"
    for key, what, kind in (("dead_fraction", "dead units", "ReLU-family"),
                            ("saturated_fraction", "saturated", "tanh/sigmoid-family")):
        rows = [r for r in act_rows if r[key] is not None]
        if rows:
            worst = max(rows, key=lambda r: r[key])
            text += (f"; {what} at most {worst[key]:.1%} ({worst['_label']}) after {len(rows)} {kind} "
                     f"module{'s' * (len(rows) != 1)}")
    if not opts.all:
        text += "; --all prints every module (--json key 'activations')"
    return "Activation health", text
