"""--steps N: train a copy of the model on the same batch and report the step, the phase (forward,
loss, backward, update) and the place where values first go non-finite. A healthy step costs two
host syncs whatever the depth: the flagged pass's read-back (loss and flags) and the batched
finiteness of the updated parameters."""
from __future__ import annotations

import math

from ...core import train
from ...core.device import wide_float, widened
from ...core.guard import restore_buffers, snapshot_buffers
from ...core.readback import read_back
from ...errors import ModelError
from ...results import Result
from .checked import PassReport
from .finite import all_finite, counts, finite
from .flags import localized_pass
from .report import fmt_counts, fmt_range, steps_summary

HINT = "lower the learning rate, clip gradients, or look for an op that overflows as weights grow"


def _norms(params) -> list:
    """float64 norms of parameters (float32 on mps), left on the device (read only when a step goes non-finite)."""
    import torch

    return [widened(torch.linalg.vector_norm(p.detach())) if p.is_complex()   # complex norms keep their own dtype
            else torch.linalg.vector_norm(p.detach(), dtype=wide_float(p.device)) for p in params]


def grew_most(work, start: dict) -> dict | None:
    """The trainable parameter whose norm grew most since step 1 (relative; absolute from zero):
    the weights to look at when the forward, loss or backward goes non-finite while every
    parameter is still finite."""
    named = [(n, p) for n, p in work.named_parameters() if n in start]
    values = read_back([start[n] for n, _ in named] + _norms(p for _, p in named))
    best, key = None, None
    for i, (n, _) in enumerate(named):
        before, now = values[i], values[len(named) + i]
        k = (now / before, 0.0) if before > 0 else (math.inf if now > 0 else 1.0, now)
        if key is None or k > key:
            best, key = {"parameter": n, "norm_start": before, "norm_now": now}, k
    if best is not None and best["norm_now"] <= best["norm_start"]:
        return None       # nothing grew: the weights are not the story
    return best


def _same_fill(rep: PassReport, fill: dict | None) -> bool:
    """The step's first non-finite module output is the first pass's constant fill (report.filled): the same module,
    as many ±Inf, no NaN. An overflow before it moves the origin; one inside it changes the count; one after it that
    reaches the loss leaves the loss non-finite (only the fill's positions are left out of it)."""
    o = rep.origin
    return (fill is not None and o is not None and o.inputs_finite and (o.name or "(root)") == fill["module"]
            and sum(b[1] for b in o.bad_outputs) == 0 and sum(b[2] for b in o.bad_outputs) == fill["inf"])


def first_bad(step: int, rep: PassReport, fill: dict | None = None) -> dict | None:
    """Where the pass of `step` first saw a non-finite value (None when it saw none)."""
    if rep.origin is not None and not _same_fill(rep, fill):
        o = rep.origin
        return {"step": step, "phase": "forward", "where": o.name or "(root)", "type": o.type,
                "nan": sum(b[1] for b in o.bad_outputs), "inf": sum(b[2] for b in o.bad_outputs),
                "input_min": o.input_range[0], "input_max": o.input_range[1]}
    if not rep.loss_finite:
        return {"step": step, "phase": "loss", "where": "loss", "value": rep.loss_value, "output": rep.output_note}
    if rep.backward_origin or rep.output_grad_bad or rep.param_grad_rows:
        b = rep.backward_origin
        return {"step": step, "phase": "backward", "where": (b["name"] or "(root)") if b else "loss",
                "type": b["type"] if b else None, "parameters": [r["parameter"] for r in rep.param_grad_rows]}
    return None


def _bad_update(step: int, work, opt, ctx) -> dict | None:
    """The parameters the update made non-finite, and why where the optimizer says it (Adam's eps in float16)."""
    from ...core.rounding import adam_underflow, nonfinite_hint

    params = list(work.named_parameters())
    if all_finite(p for _, p in params):   # one sync when healthy
        return None
    bad = [(n, p) for n, p in params if not finite(p.detach())]
    nan, inf = counts(bad[0][1])
    why = adam_underflow(opt, str(bad[0][1].dtype).replace("torch.", "")) if _zero_moment(opt, bad) else ""
    hint = nonfinite_hint(ctx) if why else None
    beyond = "" if why else _lr_beyond(ctx)
    if beyond:
        why, hint = beyond, f"lower {ctx.option('lr')}, or keep float32 weights ({ctx.option('amp')})"
    return {"step": step, "phase": "update", "where": bad[0][0], "nan": nan, "inf": inf, "parameters": [n for n, _ in bad],
            "why": why, "hint": hint}


def _lr_beyond(ctx) -> str:
    """The learning rate does not fit the weights' reduced dtype: every update it scales overflows (a review: Adam at
    lr 1e5 on float16 weights was told Adam's eps, where eps broke only the rows no batch used)."""
    p, opt = ctx.precision, getattr(ctx.spec, "optimizer", None)
    lr = getattr(opt, "learning_rate", None)
    if p.dtype is None or not p.reduced or p.amp or lr is None or abs(lr) <= p.facts.max:
        return ""
    return f"{ctx.option('lr')} {lr:g} is beyond {p.dtype}'s largest value ({p.facts.max:g}): the update it scales overflows"


def _zero_moment(opt, bad: list) -> bool:
    """Adam's second moment is 0 wherever the parameters went non-finite: its eps, 0 in float16, was all the update
    divided by. A step too large for float16 (lr 1e6: a review) breaks the weights where the moment is not 0: not
    eps; and where both happened (rows of an embedding no batch used, beside a learning rate of 1e5: a second
    review), eps is not the cause to name alone."""
    for _, param in bad:
        v = opt.state.get(param, {}).get("exp_avg_sq")
        if v is None or v.shape != param.shape or not bool((v[~param.detach().isfinite()] == 0).all()):
            return False
    return True


def train_until_non_finite(model, inputs, loss_fn, ctx, steps: int, fill: dict | None = None) -> dict | None:
    """{losses, ran, first} after up to `steps` optimizer steps on a copy; None when nothing is trainable. `fill`: the
    first pass's constant ±Inf (report.filled), not counted again at each step."""
    import torch

    with ctx.seeded(), torch.enable_grad():
        work = ctx.train_copy(model, "to run --steps on it", steps=True)
        params = [p for p in work.parameters() if p.requires_grad]
        if not params:
            return None
        opt = ctx.optimizer(params)
        start = dict(zip([n for n, p in work.named_parameters() if p.requires_grad], _norms(params)))
        losses, first, ran = [], None, 0
        for step in range(1, steps + 1):
            opt.zero_grad(set_to_none=True)
            saved = snapshot_buffers(work)   # the exact pass, if needed, starts from the same buffers
            try:
                rep = localized_pass(work, inputs, loss_fn, reset=lambda: restore_buffers(saved), device=ctx.device,
                                     autocast=ctx.autocast if ctx.precision.amp else None)
                ran = step
                losses.append(rep.loss_value)
                first = first_bad(step, rep, fill)
                if first is None:
                    train.step(opt)
                    first = _bad_update(step, work, opt, ctx)
            except ModelError as exc:
                raise ModelError(f"step {step}: {exc.message}", exc.hint) from exc
            if first is not None:
                break
        if first is not None and first["phase"] != "update":
            first["grew_most"] = grew_most(work, start)
    return {"losses": losses, "ran": ran, "first": first}


def report_steps(result: Result, out: dict | None, steps: int, optimizer) -> None:
    if out is None:
        result.notes.append("--steps skipped: the model has no trainable parameters")
        return
    losses, ran, first = out["losses"], out["ran"], out["first"]
    name, lr = optimizer.name, optimizer.learning_rate
    result.series["loss_per_step"] = losses
    result.data["steps"] = {"requested": steps, "ran": ran, "optimizer": name, "lr": lr,
                            "first_non_finite_step": first["step"] if first else None, "first": first}
    result.summary.append(steps_summary(ran, steps, losses))
    if first:
        _step_findings(result, first, f"{name}, lr={lr:g}, same batch")


def _step_findings(result: Result, first: dict, cfg: str) -> None:
    step, phase = first["step"], first["phase"]
    after = (f"by the update of step {step} ({cfg})" if phase == "update" else
             f"in step {step}, after {step - 1} update(s) ({cfg})")
    grew = first.get("grew_most")
    grown = (f"; the weights grew most in {grew['parameter']} (norm {grew['norm_start']:.4g} → {grew['norm_now']:.4g})"
             if grew else "")
    if phase == "update":
        more = len(first["parameters"]) - 1
        result.add("non-finite-param", "error", first["where"],
                   f"parameter {first['where']} became non-finite ({fmt_counts(first['nan'], first['inf'])}) "
                   f"{after}" + (f"; {more} other parameter(s) too" if more else "")
                   + (f"; why: {first['why']}" if first.get("why") else ""), hint=first.get("hint") or HINT)
    elif phase == "forward":
        result.add("non-finite-output", "error", first["where"],
                   f"{first['where']} ({first['type']}) produced {fmt_counts(first['nan'], first['inf'])} from finite "
                   f"inputs (range {fmt_range(first['input_min'], first['input_max'])}) in the forward {after}; "
                   f"all parameters were still finite{grown}", hint=HINT)
    elif phase == "loss":
        result.add("non-finite-loss", "error", "loss",
                   f"the loss became {first['value']} {after} while the model output and all parameters were "
                   f"finite{grown}" + (f"; {first['output']}" if first.get("output") else ""), hint=HINT)
    else:
        params = first["parameters"]
        named = first["where"] != "loss" and first["type"]
        if named:
            result.add("non-finite-grad", "error", first["where"],
                       f"{first['where']} ({first['type']}) produced a non-finite gradient in the backward {after}{grown}",
                       hint=HINT)
        if params:
            result.add("non-finite-param-grad", "error", params[0],
                       f"{len(params)} parameter gradient(s) non-finite in the backward {after}; first {params[0]}"
                       + ("" if named else grown), hint=HINT)
