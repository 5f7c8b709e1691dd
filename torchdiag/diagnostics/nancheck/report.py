"""What a pass found, as findings, tables and summary lines. The messages are data (findings); the
row styles and summary wording are presentation, kept here, away from the checking code."""
from __future__ import annotations

from ...results import Column, Result, Table
from .checked import PassReport

MAX_ROWS = 50
ORIGIN_STYLE, OTHER_STYLE = "bold red", "dim"


def fmt_counts(nan: int, inf: int) -> str:
    parts = []
    if nan:
        parts.append(f"{nan:,} NaN")
    if inf:
        parts.append(f"{inf:,} Inf")
    return " and ".join(parts) or "non-finite values"


def fmt_range(lo, hi) -> str:
    if lo is None:
        return "no finite floating inputs"
    return f"[{lo:.4g}, {hi:.4g}]"


def finite_pass(rep: PassReport) -> bool:
    """No NaN or Inf anywhere in the pass: forward outputs, loss, gradients."""
    return rep.origin is None and not rep.output_bad and backward_finite(rep)


def backward_finite(rep: PassReport) -> bool:
    """The loss and every gradient finite."""
    return rep.loss_finite and not rep.output_grad_bad and rep.backward_origin is None and not rep.param_grad_rows


def report_tensors(result: Result, input_rows: list, state_rows: list, finite_pass: bool = False,
                   loss_finite: bool = True, output_finite: bool = True, mask_made: bool = False,
                   carried: set | frozenset = frozenset(), overflow: dict | None = None) -> None:
    """Non-finite model inputs, parameters and buffers (before the forward); `overflow`: those the --dtype cast made
    ±Inf (core.precision.cast_overflow). Buffers holding ±Inf (no NaN) in a
    pass that stayed finite are bounds or fills, judged by what the pass did (Gemma 4's audio layers clip
    with input_min/input_max buffers at ∓Inf, no clipping until calibrated): one info finding, not an error each.
    So are additive-mask buffers in a forward whose every non-finite value is a fill (`carried`, by name:
    core/fills.py, a vocabulary mask added to the logits, or one not used) when the loss and gradients stayed finite;
    any other buffer holding ±Inf keeps its error (a review: an overflowed running_var beside the mask)."""
    masks = {r["tensor"] for r in input_rows if r.pop("additive_mask", False)}
    for r in input_rows:
        if r["kind"] == "target":   # the loss's NaN is the target's only from a finite output (reviews)
            blamed = not loss_finite and output_finite
            said = ("" if blamed else ", and the loss stayed finite: missing labels the loss masks" if loss_finite
                    else "; the model's own output is non-finite already (below)")
            result.add("non-finite-target", "error" if blamed else "info", r["tensor"],
                       f"the batch's {r['tensor']} holds {fmt_counts(r['nan'], r['inf'])}{said}",
                       hint="the data, not the model or the loss: `torchdiag data` names the samples" if blamed else None)
            continue
        if (finite_pass or mask_made) and r["tensor"] in masks:   # 0 / -inf: an attention mask, no bad data
            result.add("inf-input", "info", r["tensor"], f"model input {r['tensor']} holds {fmt_counts(0, r['inf'])} "
                       "(every one -inf, every other value ≤ 0): an additive attention mask, not bad data; " + (
                           "the forward, the loss and every gradient stayed finite" if finite_pass else
                           "the NaN below is made of it by the model"))
            continue
        result.add("non-finite-input", "error", r["tensor"], f"model input {r['tensor']} holds {fmt_counts(r['nan'], r['inf'])}",
                   hint="the data is bad before the model runs: check the data pipeline")
    bounds = [r for r in state_rows if (finite_pass or r["tensor"] in carried) and r["kind"] == "buffer"
              and not r["nan"]]
    if bounds:
        names = ", ".join(r["tensor"] for r in bounds[:6]) + (f" … (+{len(bounds) - 6} more)" if len(bounds) > 6 else "")
        result.add("inf-buffer", "info", bounds[0]["tensor"] if len(bounds) == 1 else "",
                   f"{len(bounds)} buffer(s) hold ±Inf ({names}), and " + (
                       "the forward, the loss and every gradient stayed finite: bounds or fill values (a clamp's "
                       "limits, a mask), not values the model computes with" if finite_pass else
                       "each is an additive mask (-inf, else ≤ 0) the forward adds to its output or does not use, "
                       "every other non-finite value a fill (below), the loss and every gradient finite: a mask it "
                       "holds, or a checkpoint's fault if it should be finite"))
    for r in state_rows:
        if r in bounds:
            continue
        cast = (overflow or {}).get(r["tensor"])
        result.add("non-finite-param", "error", r["tensor"],
                   f"{r['kind']} {r['tensor']} ({r['shape']}) already holds {fmt_counts(r['nan'], r['inf'])}" + (
                       f": {cast[0]} finite value(s) up to |{cast[1]:.3g}| beyond the run's dtype's range, made ±Inf "
                       "by the --dtype cast" if cast else ""),
                   hint="run it in a dtype whose range holds them (float16's largest is 65504; bfloat16's and "
                   "float32's 3.4e38), or keep those weights smaller" if cast else
                   "check the initialisation or the checkpoint that was loaded")
    # JSON keys are stable: every table is present (empty lists on a clean run; the console and
    # TensorBoard skip empty tables), and optional parts are null when not requested
    result.tables.append(Table("non_finite_tensors", "Non-finite inputs, parameters and buffers", [
        Column("tensor", "tensor"), Column("kind", "kind"), Column("shape", "shape"),
        Column("nan", "NaN", "count"), Column("inf", "Inf", "count")], input_rows + state_rows))


def own_code(origin, done) -> dict | None:
    """When the origin called submodules, where in its own code the values went bad: after which
    nested call (the last to finish before) and before which (the first to receive a non-finite
    input). None when the origin called no submodule (the culprit is already as narrow as it gets).
    A call c is nested in the origin when it started after it (index) and finished before it (done)."""
    nested = [c for c in done if c.index > origin.index and c.done < origin.done]
    if not nested:
        return None
    consumers = [c for c in nested if not c.inputs_finite]
    consumer = min(consumers, key=lambda c: c.index) if consumers else None
    # calls that finished before the consumer started (not its ancestors, which were still open)
    before = [c for c in nested if consumer is None or (c.index < consumer.index and c.done < consumer.done)]
    after = max(before, key=lambda c: c.done) if before else None
    return {"after": (after.name or "(root)") if after else None, "after_type": after.type if after else None,
            "first_consumer": (consumer.name or "(root)") if consumer else None,
            "first_consumer_type": consumer.type if consumer else None}


def _origin_message(origin, forward: dict, n_bad: int) -> str:
    where, own, label = forward["module"], forward["own_code"], forward["output"]
    held, span = (("finite inputs", "input range") if origin.inputs_finite else
                  ("inputs holding ±Inf but no NaN (an additive mask's -inf, or an Inf in the data)", "finite values' range"))
    msg = (f"{where} ({origin.type}) produced {fmt_counts(forward['nan'], forward['inf'])} in {label} from {held} "
           f"({span} {fmt_range(forward['input_min'], forward['input_max'])})")
    if origin.input_note:
        msg += f"; {origin.input_note}"
    unmeasured = _transformed_in(where)
    if own and unmeasured:   # a submodule run inside a torch.func transform is not measured: it may be there
        msg += (f"; it arose in {where}'s own forward code or in a submodule it ran inside a torch.func transform "
                f"({', '.join(unmeasured[:3])}{' …' if len(unmeasured) > 3 else ''}; not measured there), not in "
                "a measured submodule")
    elif own and own["first_consumer"]:
        consumer = f"{own['first_consumer']} ({own['first_consumer_type']})"
        msg += (f"; it arose in {where}'s own forward code, not in a submodule: "
                + (f"between {own['after']} ({own['after_type']}) returning finite values and {consumer} "
                   "receiving it" if own["after"] else f"before its first submodule call, {consumer}, received it"))
    elif own:
        msg += (f"; every submodule it called returned finite values: it arose in {where}'s own forward code "
                f"after its last submodule call, {own['after']} ({own['after_type']})")
    if n_bad > 1:
        msg += f"; {n_bad - 1} other module call(s) downstream carry it on"
    return msg


def _transformed_in(where: str) -> list[str]:
    """The submodules of `where` whose calls ran inside a torch.func transform, unmeasured (core/tracking.py)."""
    from ...core.tracking import TRANSFORMED

    return sorted(n for n in TRANSFORMED if n != where and (where == "(root)" or n.startswith(where + ".")))


def filled(rep: PassReport, ctx) -> dict | None:
    """The pass's first non-finite module output when the model writes its values as constants (core/fills.py:
    Grounding DINO's -inf padding, a mask buffer added to the logits): {module, inf, how, sources}; None otherwise (a
    NaN, non-finite inputs, or any non-finite value of the forward an op computed)."""
    o = _inf_origin(rep)
    if o is None:
        return None
    fills, inf = ctx.fills(), sum(b[2] for b in o.bad_outputs)
    # the loss left them out (fills at other positions than the fills' own forward, drawn at random, it did not)
    if not fills.only_fills or not rep.loss_finite or inf > fills.bound(root=not o.name):
        return None
    return {"module": o.name or "(root)", "inf": inf, "how": fills.describe(), "written": fills.written,
            "sources": sorted(fills.sources)}


def _inf_origin(rep: PassReport):
    """The pass's origin when it made ±Inf, no NaN, from finite inputs: what core/fills.py is asked about."""
    o = rep.origin
    return None if o is None or not o.inputs_finite or sum(b[1] for b in o.bad_outputs) else o


def fills_note(rep: PassReport, ctx) -> str | None:
    """Why a forward's ±Inf were not traced to their ops, when the tracing itself could not run."""
    if _inf_origin(rep) is None or ctx.fills().failed is None:
        return None
    return f"the forward's ±Inf not traced to the ops that made them (a fill or a computation): {ctx.fills().failed}"


def report_forward(result: Result, rep: PassReport, fill: dict | None = None, cast: frozenset = frozenset()) -> list:
    """The forward origin (finding + data["forward"]) and the table of calls with non-finite outputs; `fill`
    (filled()): the origin's ±Inf are constants the model writes, an info finding."""
    done = sorted((c for c in rep.calls if c.done >= 0), key=lambda c: c.done)
    bad = [c for c in done if c.bad_outputs]
    origin = rep.origin
    forward = None
    if origin is not None:
        lo, hi = origin.input_range
        forward = {"module": origin.name or "(root)", "type": origin.type, "output": origin.bad_outputs[0][0],
                   "nan": sum(b[1] for b in origin.bad_outputs), "inf": sum(b[2] for b in origin.bad_outputs),
                   "outputs": [{"output": lb, "nan": n, "inf": i} for lb, n, i in origin.bad_outputs],
                   "input_min": lo, "input_max": hi, "later_modules_affected": len(bad) - 1,
                   "own_code": own_code(origin, done)}
        # its own weight already non-finite (a checkpoint's NaN): the values are the weight's, not an operation's
        own = [f.where for f in result.findings if f.code == "non-finite-param"
               and (f.where.rsplit(".", 1)[0] if "." in f.where else "(root)") == forward["module"]]
        hint = (f"its own parameter {own[0]} is non-finite already (above): the weight carries it, not an operation; "
                + ("its finite value lies beyond the run's dtype's range: run it in a wider one" if own[0] in cast else
                   "look at the checkpoint or the initialisation") if own else
                "look at the operations in this module's forward (log/sqrt/division/exp/pow) for these inputs"
                + (" and in the submodules it runs under the transform, or call them outside it to have them measured"
                   if _transformed_in(forward["module"]) else "")
                if origin.inputs_finite else
                "a mask's -inf reached an op that makes NaN of it (softmax or max over a row masked throughout, a sample "
                "of only padding; -inf − -inf; 0 × -inf): keep one position per row unmasked, or mask with "
                "torch.finfo(dtype).min instead of -inf")
        if fill is not None:
            forward["fill"] = True
            # a ban vector's one -inf added to every row: fewer written than the output holds (core/fills.py's bound)
            spread = (f", carried onto {forward['inf']:,} positions by the ops after" if 0 < fill["written"] <
                      forward["inf"] else "")
            result.add("inf-fill", "info", forward["module"], f"{forward['module']} ({origin.type}) holds "
                       f"{forward['inf']:,} ±Inf in {forward['output']}: constants {fill['how']}{spread}; no op of the "
                       "forward computed a non-finite value: masked positions, by design" + (
                           f" (buffer {', '.join(fill['sources'])} held them before the forward: a mask, or a "
                           "checkpoint's fault if it should be finite)" if fill["sources"] else "") + (
                           f"; {len(bad) - 1} other module call(s) downstream carry them on" if len(bad) > 1 else ""),
                       hint="a loss on this output must leave those positions out (torchdiag's made-up loss does)")
        else:
            result.add("non-finite-output", "error", forward["module"], _origin_message(origin, forward, len(bad)),
                       hint=hint)
    elif bad:
        # non-finite from the start (inputs or parameters): name the first module anyway
        result.notes.append(f"forward: the first non-finite output is at {bad[0].name or '(root)'} ({bad[0].type}), "
                            "but its inputs were already non-finite")
    result.data["forward"] = forward
    rows = [{"order": c.done, "module": c.name or "(root)", "type": c.type, "output": c.bad_outputs[0][0],
             "nan": sum(b[1] for b in c.bad_outputs), "inf": sum(b[2] for b in c.bad_outputs),
             "inputs_finite": c.inputs_finite, "origin": c is origin,
             "_style": ORIGIN_STYLE if c is origin else OTHER_STYLE} for c in bad[:MAX_ROWS]]
    note = None
    if rows:
        note = f"{len(bad)} module call(s) with non-finite outputs, in completion order (innermost first)"
        if len(bad) > MAX_ROWS:
            note += f"; first {MAX_ROWS} shown"
    result.tables.append(Table("forward_non_finite", "Forward: modules whose output is non-finite", [
        Column("order", "#", "int"), Column("module", "module"), Column("type", "type"),
        Column("output", "output"), Column("nan", "NaN", "count"), Column("inf", "Inf", "count"),
        Column("inputs_finite", "inputs finite", "int"), Column("origin", "origin", "int")], rows, note=note))
    return bad


def report_loss(result: Result, rep: PassReport) -> None:
    if rep.loss_finite:
        return
    forward_bad = bool(rep.output_bad)
    target = any(f.code == "non-finite-target" and f.severity == "error" for f in result.findings)   # blamed
    why = ("because the model output is already non-finite" if forward_bad else
           "from a finite model output: the target is non-finite (above)" if target else
           "from a finite model output: the loss function itself produced it")
    facts = f"; {rep.output_note}" if rep.output_note and not forward_bad and not target else ""
    result.add("non-finite-loss", "error", "loss", f"loss ({rep.loss_desc}) = {rep.loss_value} {why}{facts}",
               hint=None if forward_bad or target else "check the loss for log(0), division by zero or overflow; "
                                                        "a custom --loss PATH:fn is called as fn(output, target)")


def report_backward(result: Result, rep: PassReport, upstream: bool) -> None:
    """The backward origin (only when the forward and loss were finite) and its table."""
    result.data["backward"] = rep.backward_origin
    rows = []
    if rep.backward_ran:
        b = rep.backward_origin
        if b and not upstream:
            where = b["name"] or "(root)"
            via = ("its inputs" if b["via"] == "inputs" else "its own parameters (its inputs need no gradient)")
            result.add("non-finite-grad", "error", where,
                       f"{where} ({b['type']}) turned a finite output gradient into {fmt_counts(b['nan'], b['inf'])} "
                       f"in the gradient w.r.t. {via}; the forward pass was finite",
                       hint="a backward-only NaN: sqrt/norm/pow at 0, acos/asin at ±1, log of 0 masked by where(), "
                            "or 0×inf; add an eps or clamp")
        elif rep.output_grad_bad and not upstream:
            result.add("non-finite-grad", "error", "loss",
                       "the gradient of the loss w.r.t. the model output is non-finite while the loss is finite",
                       hint="the loss function's backward produced it")
        rows = rep.backward_rows[:MAX_ROWS]
        for r in rows:
            r["origin"] = bool(b) and r["module"] == (b["name"] or "(root)")
            r["_style"] = ORIGIN_STYLE if r["origin"] else OTHER_STYLE
    elif rep.backward_note:
        result.notes.append(rep.backward_note)
    result.tables.append(Table("backward_non_finite", "Backward: modules whose input gradient is non-finite", show=not upstream, columns=[
        Column("order", "#", "float"), Column("module", "module"), Column("type", "type"),
        Column("via", "w.r.t."), Column("grad_out_finite", "grad at output finite", "int"),
        Column("nan", "NaN", "count"), Column("inf", "Inf", "count")], rows=rows,
        note="in backward order; the origin is the first whose output gradient was finite"))


def report_param_grads(result: Result, rep: PassReport, upstream: bool) -> None:
    result.data["param_grads_checked"] = rep.grads_checked
    rows = rep.param_grad_rows
    if rows:
        first = rows[0]
        others = ", ".join(r["parameter"] for r in rows[1:6]) + (" …" if len(rows) > 6 else "")
        b = rep.backward_origin
        cause = (" (follows from the non-finite forward/loss)" if upstream else
                 f" (from the backward of {b['name'] or '(root)'})" if b else "")
        result.add("non-finite-param-grad", "error", first["parameter"],
                   f"{len(rows)} of {rep.grads_checked} parameter gradient(s) are non-finite{cause}; first "
                   f"{first['parameter']} ({fmt_counts(first['nan'], first['inf'])})" + (f"; also {others}" if others else ""))
    result.tables.append(Table("param_grads_non_finite", "Parameter gradients with NaN/Inf", [
        Column("parameter", "parameter"), Column("shape", "shape"), Column("nan", "NaN", "count"),
        Column("inf", "Inf", "count")], list(rows[:MAX_ROWS])))


def report_pass(result: Result, rep: PassReport, fill: dict | None = None, cast: frozenset = frozenset()) -> None:
    """`cast`: the weights the --dtype cast made ±Inf (core.precision.cast_overflow)."""
    result.data["modules_checked"] = rep.modules_checked
    result.data["loss_value"] = rep.loss_value
    bad = report_forward(result, rep, fill, cast)
    report_loss(result, rep)
    # a NaN target under a finite loss (missing labels a loss masks) leaves the backward to be localised: a review's
    # torch.where over (out - y)**2 made NaN gradients, the loss's backward, which "follows from" hid
    upstream = bool(rep.output_bad) and fill is None or not rep.loss_finite or any(
        f.severity == "error" and f.code != "non-finite-target" for f in result.findings)
    report_backward(result, rep, upstream)
    report_param_grads(result, rep, upstream)
    result.summary += pass_summary(result, rep, bad, upstream)


def pass_summary(result: Result, rep: PassReport, bad: list, upstream: bool) -> list:
    """The summary lines of the pass (presentation)."""
    def state(code):
        if any(f.code == code for f in result.findings):
            return "NON-FINITE"
        masked = code == "non-finite-input" and any(f.code == "inf-input" for f in result.findings)
        return "finite but an additive mask's -inf (inf-input)" if masked else "finite"

    first = rep.origin if rep.origin is not None else (bad[0] if bad else None)
    b = rep.backward_origin
    return [
        ("Inputs", state("non-finite-input")),
        ("Parameters and buffers", state("non-finite-param")),
        ("Forward", f"{rep.modules_checked} module calls checked; " +
         ("all outputs finite" if first is None else f"first non-finite at {first.name or '(root)'} ({first.type})")),
        ("Loss", f"{rep.loss_value:.6g} ({rep.loss_desc})" if rep.loss_value is not None else "—"),
        ("Backward", "not run" if not rep.backward_ran else
         "non-finite (follows from the forward/loss)" if upstream and rep.param_grad_rows else
         f"first non-finite at {b['name'] or '(root)'}" if b else
         "non-finite" if rep.param_grad_rows or rep.output_grad_bad else "all gradients finite"),
        ("Parameter gradients", f"{rep.grads_checked} checked; " +
         (f"{len(rep.param_grad_rows)} non-finite" if rep.param_grad_rows else "all finite")),
    ]


def steps_summary(ran: int, steps: int, losses: list) -> tuple[str, str]:
    """The "Steps" summary line: how many ran, and the loss curve as a sparkline (log scale when positive)."""
    import math

    from ...fmt import sparkline

    shown = [v for v in losses if v is not None and math.isfinite(v)]
    spark = sparkline([math.log10(v) for v in shown]) if shown and min(shown) > 0 else sparkline(shown)
    return ("Steps", f"{ran} of {steps} run; loss {spark} " + (f"{shown[0]:.4g} → {shown[-1]:.4g}" if shown else ""))
