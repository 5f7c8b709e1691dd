"""--steps N with --amp fp16: train a copy as fp16 autocast training does, with a GradScaler: the loss is
multiplied by the scale before backward; a step whose gradients are non-finite is skipped and the scale
halved (torch.amp.GradScaler's own rule). Reports the scale per step, the steps skipped, and where the
first non-finite value of a skipped step came from. Every step skipped is an error: training never moves.

The scale per step is followed in Python from the skips we see (init × backoff per skip, × growth after
`growth_interval` good steps), so reading it costs no host sync; torch's own value is read once at the end
and a disagreement is noted."""
from __future__ import annotations

from ...core.guard import restore_buffers, snapshot_buffers
from ...errors import ModelError
from ...results import Result
from .flags import localized_pass
from .report import fmt_counts, steps_summary
from .steps import _bad_update, first_bad

HINT_FORWARD = ("a forward overflow no loss scale fixes: keep that op in float32 (torch.autocast(enabled=False) "
                "and .float()), scale its input down, or use --amp bf16")
HINT_BACKWARD = ("the scaled gradient overflows float16; the scaler halves its scale per skipped step, so more --steps "
                 "show whether it recovers; else rescale that op or the loss, or use --amp bf16")


class ScaledLoss:
    """The loss rule, its value multiplied by the scaler's scale (scaler.scale(loss))."""

    def __init__(self, loss_fn, scaler):
        self.loss_fn, self.scaler = loss_fn, scaler

    def __call__(self, output):
        return self.scaler.scale(self.loss_fn(output))

    def describe(self) -> str:
        return self.loss_fn.describe()


class ScaleMirror:
    """GradScaler's scale, followed from the skips (no host sync)."""

    def __init__(self, scaler):
        self.scale = scaler.get_scale() if scaler.is_enabled() else 1.0   # before the first step: no sync
        self.growth, self.backoff = scaler.get_growth_factor(), scaler.get_backoff_factor()
        self.interval, self.good = scaler.get_growth_interval(), 0

    def update(self, skipped: bool) -> None:
        if skipped:
            self.scale *= self.backoff
            self.good = 0
        else:
            self.good += 1
            if self.good == self.interval:
                self.scale *= self.growth
                self.good = 0


def _scaled_step(work, inputs, scaled, ctx, opt, scaler, step: int):
    """One scaled step: (PassReport, skipped, bad-update dict or None)."""
    opt.zero_grad(set_to_none=True)
    saved = snapshot_buffers(work)
    try:
        rep = localized_pass(work, inputs, scaled, reset=lambda: restore_buffers(saved), device=ctx.device,
                             autocast=ctx.autocast)
        skipped = bool(rep.param_grad_rows)   # what the scaler checks: the optimizer's gradients
        scaler.step(opt)       # skips by itself when a gradient is non-finite
        scaler.update()
    except ModelError as exc:
        raise ModelError(f"step {step}: {exc.message}", exc.hint) from exc
    except Exception as exc:
        raise ModelError(f"step {step}: the GradScaler step failed: {exc}") from exc
    return rep, skipped, None if skipped else _bad_update(step, work, opt, ctx)


def train_scaled(model, inputs, loss_fn, ctx, steps: int, fill: dict | None = None) -> dict | None:
    """{losses, scales, skipped, first, ran, final_scale, bad_update} after `steps` scaled steps on a copy (`fill`: as
    steps.train_until_non_finite's)."""
    import torch

    with ctx.seeded(), torch.enable_grad():
        work = ctx.train_copy(model, "to run --steps on it", steps=True)
        params = [p for p in work.parameters() if p.requires_grad]
        if not params:
            return None
        opt, scaler = ctx.optimizer(params), ctx.grad_scaler()
        mirror, scaled = ScaleMirror(scaler), ScaledLoss(loss_fn, scaler)
        out = {"losses": [], "scales": [], "skipped": [], "first": None, "ran": 0, "bad_update": None}
        for step in range(1, steps + 1):
            rep, skipped, bad = _scaled_step(work, inputs, scaled, ctx, opt, scaler, step)
            out["ran"] = step
            out["scales"].append(mirror.scale)
            out["losses"].append(rep.loss_value / mirror.scale)
            mirror.update(skipped)
            if skipped:
                out["skipped"].append(step)
                out["first"] = out["first"] or first_bad(step, rep, fill)
            if bad is not None:
                out["bad_update"] = bad
                break
        out["final_scale"], out["mirror_scale"] = scaler.get_scale(), mirror.scale   # one sync, at the end
    return out


def report_scaled(result: Result, out: dict | None, steps: int, optimizer) -> None:
    if out is None:
        result.notes.append("--steps skipped: the model has no trainable parameters")
        return
    ran, skipped, first = out["ran"], out["skipped"], out["first"]
    result.series["loss_per_step"] = out["losses"]
    result.series["grad_scale_per_step"] = out["scales"]
    result.data["steps"] = {"requested": steps, "ran": ran, "optimizer": optimizer.name, "lr": optimizer.learning_rate,
                            "first_non_finite_step": first["step"] if first else None, "first": first,
                            "grad_scaler": {"scale_per_step": out["scales"], "skipped_steps": skipped,
                                            "skipped": len(skipped), "final_scale": out["final_scale"]}}
    result.summary.append(steps_summary(ran, steps, out["losses"]))
    result.summary.append(("GradScaler", f"scale {out['scales'][0]:g} → {out['final_scale']:g}; "
                                         f"{len(skipped)} of {ran} step(s) skipped"))
    if out["final_scale"] != out["mirror_scale"]:
        result.notes.append(f"GradScaler: torch's final scale {out['final_scale']:g} differs from the one followed "
                            f"step by step ({out['mirror_scale']:g}): the per-step scales may be off")
    if out["bad_update"] is not None:
        b = out["bad_update"]
        result.add("non-finite-param", "error", b["where"], f"parameter {b['where']} became non-finite "
                   f"({fmt_counts(b['nan'], b['inf'])}) by the update of step {b['step']} (fp16 autocast, GradScaler)")
    if skipped and len(skipped) == ran:
        _every_step_skipped(result, first, ran, out)
    elif skipped:
        result.add("skipped-steps", "info", first["where"] if first else "",
                   f"the GradScaler skipped {len(skipped)} of {ran} step(s) (steps {', '.join(map(str, skipped[:10]))}) "
                   f"and lowered its scale to {out['final_scale']:g}; the other steps ran")


def _every_step_skipped(result: Result, first: dict, ran: int, out: dict) -> None:
    where, phase = first["where"], first["phase"]
    if phase == "forward":
        what = f"{where} ({first['type']}) produced {fmt_counts(first['nan'], first['inf'])} in the forward"
    elif phase == "loss":
        what = f"the loss was {first.get('value')}"
    elif where == "loss":
        what = "the gradient at the model output (scale × d loss / d output) was already non-finite"
    else:
        what = f"the first non-finite gradient came from {where}" + (f" ({first['type']})" if first.get("type") else "")
    result.add("every-step-skipped", "error", where,
               f"the GradScaler skipped every one of the {ran} step(s) (scale {out['scales'][0]:g} → "
               f"{out['final_scale']:g}): the model never trained; in step 1 (scale {out['scales'][0]:g}) {what}",
               hint=HINT_FORWARD if phase in ("forward", "loss") else HINT_BACKWARD)


__all__ = ["train_scaled", "report_scaled", "ScaleMirror", "ScaledLoss"]
