"""update-rounds-away: with reduced-precision weights (--dtype bfloat16/float16) an optimizer update
smaller than half a unit in the last place of a weight rounds back to the weight itself, and the
parameter silently stops training (bf16 has 8 significant bits: at 1.0, anything below 2^-9 is lost).

Measured, not predicted: after a real step, the fraction of a parameter's elements whose gradient is
non-zero but whose value did not change. Counted on the device; the caller reads the counts back with
its own facts. Used by doctor's update check and by overfit-batch (its first step). float32 weights
are never checked (no counts, no extra syncs)."""
from __future__ import annotations

import math

from .distributed import local_shard
from .precision import is_reduced

STAGNANT_FRACTION = 0.5      # a parameter is reported when at least half its moving elements stand still
CODE = "update-rounds-away"


def hint(ctx, lr_option: bool = True) -> str:
    """The remedies, with the options named as the caller writes them: the dtype option only when the weights
    were cast by it (a model built in bf16 was not: a review), the learning rate's only where the command has one
    (`lr_option`: doctor's command line does not)."""
    amp, dtype = ctx.option("amp"), ctx.spec.dtype
    master = (f"train with {amp} bf16 (autocast) instead of {ctx.option('dtype')} {dtype}" if is_reduced(dtype or "")
              else f"build the model in float32 and train it under autocast ({amp} bf16)")
    lr = f" ({ctx.option('lr')})" if lr_option else ""
    return (f"keep float32 master weights: {master}; or raise the learning rate{lr}, or use an optimizer with Kahan "
            "summation / stochastic rounding for reduced-precision weights")


def stagnation_counts(named, before) -> list:
    """[(name, 2-element device tensor [unchanged-with-nonzero-grad, nonzero-grad])] for the reduced-
    precision parameters of `named` that have a gradient; `before` holds their values before the step
    (under FSDP: this rank's shards, whose counts the caller sums over the ranks)."""
    import torch

    out = []
    for n, p in named:
        if p.grad is None or not is_reduced(p.dtype) or p.grad.is_sparse:
            continue
        value, grad = local_shard(p.detach()), local_shard(p.grad.detach())   # FSDP: this rank's shard
        if value.shape != before[n].shape:
            continue
        moving = grad != 0
        stuck = moving & (value == before[n])
        out.append((n, torch.stack([stuck.sum(), moving.sum()])))
    return out


def rounded_away(names: list[str], values: list[float], dtypes: dict[str, str]) -> list[dict]:
    """The parameters at or over STAGNANT_FRACTION: rows {name, dtype, unchanged, moving, fraction},
    worst first. `values` holds the read-back counts, two per name."""
    rows = []
    for i, n in enumerate(names):
        stuck, moving = int(values[2 * i]), int(values[2 * i + 1])
        if moving and stuck / moving >= STAGNANT_FRACTION:
            rows.append({"name": n, "dtype": dtypes[n], "unchanged": stuck, "moving": moving,
                         "fraction": stuck / moving})
    rows.sort(key=lambda r: (-r["fraction"], r["name"]))
    return rows


def message(rows: list[dict], lr: float, step: str, limit: int = 6) -> str:
    """One finding message naming the parameters and their unchanged fractions."""
    shown = ", ".join(f"{r['name']} {100 * r['fraction']:.0f}%" for r in rows[:limit])
    more = f" … (+{len(rows) - limit} more)" if len(rows) > limit else ""
    dtype = rows[0]["dtype"]
    return (f"{len(rows)} {dtype} parameter(s) barely move: after {step} (lr {lr:g}) these fractions of their "
            f"elements with a non-zero gradient are unchanged, the update rounded away below half a {dtype} "
            f"ulp of the weight: {shown}{more}")


def adam_underflow(optimizer, dtype: str) -> str:
    """Why an Adam/AdamW step on `dtype` weights gives Inf/NaN: its eps and its second moment
    (1 - beta2) * g**2 round to 0 below half the dtype's smallest subnormal, so m / (sqrt(v) + eps)
    divides by 0 (NaN where g = 0, Inf where g is small). "" when that is not the case (other
    optimizers, float32, bfloat16's float32 range, or an eps the dtype holds)."""
    from .precision import facts

    group = optimizer.param_groups[0] if optimizer.param_groups else {}
    if "betas" not in group or "eps" not in group or not is_reduced(dtype):
        return ""
    f, eps, beta2 = facts(dtype), float(group["eps"]), float(group["betas"][1])
    flush = f.smallest_subnormal / 2
    if eps > flush:
        return ""
    g_min = math.sqrt(flush / (1 - beta2)) if beta2 < 1 else math.inf
    return (f"Adam's eps {eps:g} is 0 in {dtype} (at most half its smallest subnormal {f.smallest_subnormal:.3g}) and "
            f"its second moment (1 - beta2)·g² = {1 - beta2:g}·g² is 0 for |g| ≤ {g_min:.2g}: the update "
            "m / (√v + eps) divides by 0 (NaN where g = 0, Inf for small g)")


def nonfinite_hint(ctx, optimizer_option: bool = True) -> str:
    """The remedies for adam_underflow, with the options named as the caller writes them; `optimizer_option`: the
    caller has one (doctor's command line and check's doctor do not, its Python call does: a sweep found the CLI's
    hint naming an option it refuses)."""
    amp, dtype = ctx.option("amp"), ctx.option("dtype")
    sgd = f"{ctx.option('optimizer')} sgd" if optimizer_option else "plain SGD"
    return (f"keep float32 master weights: train with {amp} fp16 (autocast + GradScaler) or {amp} bf16 instead of "
            f"{dtype} float16; pure float16 weights need Adam's state and eps in float32 (or an eps ≥ 1e-4), or "
            f"{sgd} (no eps, no second moment)")
