"""Gradient underflow under reduced precision (--dtype bfloat16/float16, --amp bf16/fp16).

A gradient value counts as underflowed when its magnitude is below the smallest normal number of the
reduced dtype (torch.finfo(dtype).tiny: float16 6.1e-05, bfloat16 1.2e-38), exact zeros included:
flushed to zero, or subnormal with few significant bits left. Under --amp the gradients of float32
weights are computed by fp16/bf16 ops and cast up, so the same threshold says which values those ops
could not hold unscaled: a large fraction under fp16 is the reason loss scaling exists (the verdicts judge
the gradients as a GradScaler at its starting scale gives them: core/scaling.py judged_backward). Counted on the device and read back with the other statistics (stats.read_stats):
nothing is counted, and nothing extra is read, in float32."""
from __future__ import annotations

from ...core.precision import facts, is_reduced


def reduced_dtype(ctx, params: dict) -> str | None:
    """The reduced dtype the gradients went through: the run's compute dtype (--amp's, else --dtype's),
    else the model's own (a Python caller may hand over a bf16 model); None in float32."""
    if ctx.precision.reduced:
        return ctx.precision.compute
    for p in params.values():
        if is_reduced(p.dtype):
            return str(p.dtype).replace("torch.", "")
    return None


def smallest_normal(dtype: str) -> float:
    return facts(dtype).smallest_normal


def counts(grads: list, tiny: float) -> list:
    """Per gradient: how many values are below `tiny` in magnitude, a 0-d device tensor."""
    return [(g.abs() < tiny).sum() for g in grads]


def add_fractions(rows: list[dict], layers: list[dict], underflow: dict[str, float]) -> None:
    """`underflow` (fraction of gradient values) on parameter rows with a gradient, and per layer
    over its parameters' values."""
    for r in rows:
        if r["name"] in underflow:
            r["underflow"] = underflow[r["name"]] / max(r["numel"], 1)
    by_name = {r["name"]: r for r in rows}
    for layer in layers:
        path = layer["layer"]
        members = [n for n in underflow if (layer["own_only"] and by_name[n]["module"] == path)
                   or (not layer["own_only"] and (path == "" or n.startswith(path + ".")))]
        numel = sum(by_name[n]["numel"] for n in members)
        layer["underflow"] = sum(underflow[n] for n in members) / numel if numel else None


def note(dtype: str) -> str:
    return (f"underflow: share of gradient values with |g| below {dtype}'s smallest normal "
            f"{smallest_normal(dtype):.2g} (zeros included): what the dtype cannot hold without loss scaling")
