"""What the reduced-precision checks found, as findings, tables and data["reduced_precision"]: why the first
non-finite value appeared (overflow of the dtype, or there in float32 too), headroom warnings and
gradient underflow. The measuring is in precision.py."""
from __future__ import annotations

import math

from ...core.precision import HEADROOM
from ...results import Column, Result, Table
from .precision import UNDERFLOW_WARN, call_max, headroom_rows, underflow_rows

MAX_ROWS = 50
HINTS = {"forward": "keep this op in float32 (autocast does so for listed ops; wrap it in torch.autocast(enabled=False) "
                      "and .float()), scale its input down, or use bfloat16",
         "backward": "the gradient outgrows the dtype, not the values: scale the loss or this op's factor down, keep "
                     "the op in float32, or use bfloat16 (float32's range)"}
SCALE_HINT = ("float16 without loss scaling: use --amp fp16 (a GradScaler multiplies the loss so small gradients stay "
              "above float16's smallest subnormal), or bfloat16 (float32's range)")


def g(x: float) -> str:
    """A magnitude as people write it: 8.19e+04 -> 8.19e4, 65504 -> 65,504."""
    if x is None or not math.isfinite(x):
        return str(x)
    if x == int(x) and abs(x) < 1e6:
        return f"{int(x):,}"
    mant, _, exp = f"{x:.3g}".partition("e")
    return f"{mant}e{int(exp)}" if exp else mant


def occurrence(rep, origin) -> int:
    """Which call of its module the origin was (0 = first), in completion order."""
    return sum(1 for c in rep.calls if c.name == origin.name and 0 <= c.done < origin.done)


def forward_cause(rep, ref_rep, ref_watch, prec) -> dict | None:
    """Why the reduced pass's forward origin is non-finite, from the float32 reference."""
    o = rep.origin
    if o is None:
        return None
    name, f = o.name or "(root)", prec.facts
    cause = {"phase": "forward", "module": name, "largest_finite": f.max, "dtype": f.name}
    ref_o = ref_rep.origin
    if ref_o is not None:
        same = (ref_o.name or "(root)") == name
        cause.update(kind="also-float32" if same else "float32-elsewhere", float32_module=ref_o.name or "(root)")
        return cause
    m = call_max(ref_watch, name, occurrence(rep, o), "output")
    cause["float32_max_abs"] = m
    cause["kind"] = "overflow" if m is not None and m > f.max else "reduced-precision"
    return cause


def backward_cause(rep, ref_rep, ref_watch, prec) -> dict | None:
    """Why a non-finite gradient appeared (forward and loss finite), from the float32 reference."""
    b = rep.backward_origin
    if rep.origin is not None or not rep.loss_finite or not (b or rep.param_grad_rows or rep.output_grad_bad):
        return None
    f = prec.facts
    cause = {"phase": "backward", "module": (b["name"] or "(root)") if b else None, "largest_finite": f.max, "dtype": f.name}
    if ref_rep.backward_origin or ref_rep.param_grad_rows or ref_rep.output_grad_bad or not ref_rep.loss_finite:
        cause["kind"] = "also-float32"
        return cause
    grads = [r for r in ref_watch.rows if r["kind"] == "gradient" and math.isfinite(r["max_abs"])]
    top = max(grads, key=lambda r: r["max_abs"], default=None)
    cause["float32_max_grad"] = top["max_abs"] if top else None
    cause["float32_max_grad_at"] = top["module"] if top else None
    cause["kind"] = "overflow" if top and top["max_abs"] > f.max else "reduced-precision"
    return cause


def _inner_overflow(cause, ref_work, inputs, ctx, state) -> None:
    """A forward cause whose module output is in range in float32: does an op inside the module exceed the
    dtype (measured on the float32 reference)? Then the kind is `inner-overflow`, with that op and value."""
    if not cause or cause["phase"] != "forward" or cause["kind"] != "reduced-precision":
        return
    from .precision import inner_max

    top = inner_max(ref_work, inputs, cause["module"], ctx, state, above=cause["largest_finite"])
    if top is not None and top[1] > cause["largest_finite"]:
        cause.update(kind="inner-overflow", float32_inner_op=top[0], float32_inner_max_abs=top[1])


def _inner_origin(cause, model, inputs, ctx, state) -> None:
    """A forward cause that is no overflow: the op inside the module that made the first non-finite value."""
    if not cause or cause["phase"] != "forward" or cause["kind"] != "reduced-precision":
        return
    from .precision import inner_origin

    found = inner_origin(model, inputs, cause["module"], ctx, state)
    if found is not None:
        cause.update(inner_op=found["op"], inner_detail=found["detail"])


def cause_text(c: dict) -> str:
    """The precision reason, appended to the finding that names the module."""
    dt, lim = c["dtype"], g(c["largest_finite"])
    if c["kind"] == "also-float32":
        return "; the float32 reference run has it too, at the same place: not a precision problem"
    if c["kind"] == "cast-overflow":
        return (f"; weights beyond {dt}'s largest finite {lim} became ±Inf in the {dt} cast (the header): a precision "
                "problem; the float32 reference, upcast from the cast weights, has them too")
    if c["kind"] == "float32-elsewhere":
        return f"; the float32 reference run is non-finite too, first at {c['float32_module']}: not only a precision problem"
    if c["phase"] == "forward":
        m = c["float32_max_abs"]
        if c["kind"] == "overflow":
            return (f"; why: output max |x| {g(m)} (float32 reference) exceeds {dt}'s largest finite {lim}: "
                    f"it overflows in {dt} and is finite in float32")
        if c["kind"] == "inner-overflow":
            return (f"; why: inside its forward, {c['float32_inner_op']} reaches max |x| {g(c['float32_inner_max_abs'])} "
                    f"in the float32 reference, above {dt}'s largest finite {lim}: that intermediate overflows in {dt} "
                    f"(the module's output, max |x| {g(m)} in float32, is in range)")
        if c.get("inner_op"):
            detail = f" ({c['inner_detail']})" if c.get("inner_detail") else ""
            return (f"; why: inside its forward, {c['inner_op']} gave the first non-finite value from finite inputs"
                    f"{detail}; in the float32 reference it is finite (max |x| {g(m)}): {dt} rounding or underflow "
                    "in this module (a cancellation, an eps below its smallest normal, a value that underflowed to 0)")
        return (f"; in the float32 reference this output is finite (max |x| {g(m)}), inside {dt}'s range: {dt} "
                "rounding or underflow made it (the float32 run is clean)")
    if c["kind"] == "overflow":
        return (f"; why: in the float32 reference the gradient reaches max |g| {g(c['float32_max_grad'])} (arriving at "
                f"the output of {c['float32_max_grad_at']}), above {dt}'s largest finite {lim}: it overflows in {dt}")
    return (f"; the float32 reference's backward is finite (largest |g| at a module output {g(c['float32_max_grad'])}): "
            f"a {dt} effect (rounding or underflow), not an overflow")


def _owns_overflow(module: str | None, overflow: dict) -> bool:
    """The module the cause names holds a weight the cast made ±Inf (a review: an unused buffer's 1e6 elsewhere
    relabelled a log(0) of the forward's as the cast's doing)."""
    from ...core.module_paths import owner

    where = "" if module in (None, "(root)") else module
    return any(owner(n) == where for n in overflow)


def explain(result: Result, cause: dict | None, overflow: dict | None = None) -> None:
    """Append the precision reason to the finding of the module it explains. `overflow`: weights the cast made ±Inf
    (core.precision.cast_overflow): the float32 reference, upcast from the cast copy, has them too, which says
    nothing of float32 (a sweep: "not a precision problem" of a checkpoint's 1e6 under float16)."""
    if cause is None:
        return
    if cause["kind"] == "also-float32" and _owns_overflow(cause.get("module"), overflow or {}):
        cause = dict(cause, kind="cast-overflow")
    codes = ("non-finite-output",) if cause["phase"] == "forward" else ("non-finite-grad", "non-finite-param-grad")
    for f in result.findings:
        if f.code in codes and f.severity == "error":
            f.message += cause_text(cause)
            if cause["kind"] in ("overflow", "inner-overflow"):
                f.hint = HINTS[cause["phase"]]
            return


def report_headroom(result: Result, watch) -> list:
    rows = headroom_rows(watch) if watch is not None else []
    for kind in ("output", "gradient", "parameter gradient"):
        hits = [r for r in rows if r["kind"] == kind]
        if not hits:
            continue
        top = max(hits, key=lambda r: r["max_abs"])
        what = "output max |x|" if kind == "output" else f"{kind} max |g|"
        more = f"; {len(hits) - 1} other(s) in the table" if len(hits) > 1 else ""
        result.add("precision-headroom", "warning", top["module"],
                   f"{top['module']}{' (' + top['type'] + ')' if top['type'] else ''} {what} {g(top['max_abs'])} is within "
                   f"{HEADROOM:g}× of {top['dtype']}'s largest finite {g(top['largest_finite'])} ({top['margin']:.3g}× below "
                   f"it){more}", hint="an overflow risk as weights or inputs grow: normalise, scale down, or keep it in float32")
    result.tables.append(Table("precision_headroom", f"Reduced precision: values within {HEADROOM:g}× of overflow", [
        Column("module", "module"), Column("type", "type"), Column("kind", "what"), Column("dtype", "dtype"),
        Column("max_abs", "max |x|", "float"), Column("margin", "× below max", "float")], rows[:MAX_ROWS]))
    return rows


def report_underflow(result: Result, reduced_grads: dict, ref_work, prec) -> list:
    """Range underflow per module; under --amp fp16 (a GradScaler in training) it is what happens unscaled:
    info. Zeros of the reduced run that the dtype could hold are rounding, in the table, not underflow."""
    dtype = prec.compute
    rows = underflow_rows(reduced_grads, ref_work, dtype) if ref_work is not None else []
    bad = [r for r in rows if r["fraction"] >= UNDERFLOW_WARN]
    if bad:
        top = bad[0]
        more = f"; {len(bad) - 1} other module(s) too (table)" if len(bad) > 1 else ""
        unscaled = (" in this unscaled pass; training's GradScaler multiplies the loss by its scale to keep them "
                    "(--steps shows it)" if prec.scaled else "")
        result.add("grad-underflow", "info" if prec.scaled else "warning", top["module"],
                   f"{top['underflow']:,} of {top['nonzero_float32']:,} parameter-gradient values "
                   f"({top['fraction']:.1%}) that are nonzero in float32 are below {dtype}'s range (at most half its "
                   f"smallest subnormal {g(prec.facts.smallest_subnormal)}: they round to 0) and exactly 0 in "
                   f"{dtype} (same weights and inputs, float32 reference){unscaled}{more}",
                   hint=SCALE_HINT if dtype == "float16" and not prec.scaled else None)
    for r in rows:
        r["parameters"] = ", ".join(r["parameters"])
    result.tables.append(Table("precision_underflow", f"Gradient underflow: nonzero in float32, below {dtype}'s range", [
        Column("module", "module"), Column("parameters", "parameters"), Column("nonzero_float32", "nonzero fp32", "count"),
        Column("underflow", "underflow", "count"), Column("fraction", "lost", "pct"),
        Column("subnormal", "subnormal", "count"), Column("zero_reduced", f"0 in {dtype}", "count")], rows[:MAX_ROWS],
        note=f"underflow: below {dtype}'s range (0 when cast to it) and 0 in the {dtype} run; lost: underflow ÷ nonzero "
             f"fp32; subnormal: held below {dtype}'s smallest normal {g(prec.facts.smallest_normal)} (precision lost); "
             f"0 in {dtype}: every zero of the {dtype} run, the rest being rounding (a gate flipped at 0, a sum "
             f"cancelled)"))
    return rows


def check_precision(result: Result, model, inputs, loss_fn, ctx, rep, watch, state) -> None:
    """Under reduced precision: headroom from the pass's own magnitudes; the float32 reference when the
    pass found a non-finite value (to say why) or zero parameter gradients (to measure underflow)."""
    prec = ctx.precision
    if not prec.reduced:   # JSON keys stay stable: the tables are there, empty; the part is null
        report_headroom(result, None)
        report_underflow(result, {}, None, prec)
        result.data["reduced_precision"] = None
        return
    from ...core.train import NoRoom
    from .precision import reference_pass

    data = dict(prec.as_dict(), headroom_factor=HEADROOM, reference=None, cause=None)
    failed = any(f.severity == "error" for f in result.findings)
    report_headroom(result, watch)
    why = ("a non-finite value was found" if failed else
           "the reduced run's parameter gradients hold exact zeros: underflow or rounding, told apart against it"
           if watch.has_zero_grads else None)
    ref_work, ran = None, "not needed (all finite, no zero gradients)"
    if why is not None:
        try:
            ref_work, ref_rep, ref_watch = reference_pass(model, inputs, loss_fn, ctx, state)
            ran = f"run ({why})"
        except NoRoom as exc:   # a second opinion: the pass's own findings stand, and the note says what is missing
            result.notes.append(f"the float32 reference did not run ({why}): {exc.message}")
            ran = "not run: no room for its copy (notes)"
    if ref_work is not None:
        data["reference"] = {"why": why, "loss": ref_rep.loss_value, "finite": ref_rep.origin is None and ref_rep.loss_finite
                             and not ref_rep.param_grad_rows and not ref_rep.output_grad_bad}
        data["cause"] = forward_cause(rep, ref_rep, ref_watch, prec) or backward_cause(rep, ref_rep, ref_watch, prec)
        _inner_overflow(data["cause"], ref_work, inputs, ctx, state)
        _inner_origin(data["cause"], model, inputs, ctx, state)
        explain(result, data["cause"], ctx.overflow)
    report_underflow(result, watch.grads if not failed else {}, ref_work if not failed else None, prec)
    result.data["reduced_precision"] = data
    result.summary.append(("Precision", f"{prec.describe()}; float32 reference: {ran}"))
