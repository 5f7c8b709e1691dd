"""dtype-mismatch: parameters of mixed floating dtypes, float inputs of another dtype, and (after the
eval forward) a minority dtype that silently promotes the output."""
from __future__ import annotations

from collections import Counter

from .checklist import Checklist
from .shared import short_dtype, tensors


def check_dtypes(model, inputs, ck: Checklist) -> str | None:
    """Mixed floating parameter dtypes and float inputs of another dtype; returns the main dtype."""
    counts: Counter = Counter()
    params = list(model.named_parameters())
    for _, p in params:
        if p.is_floating_point():
            counts[p.dtype] += p.numel()
    if not counts:
        return None
    main = counts.most_common(1)[0][0]
    if len(counts) > 1:
        mix = ", ".join(f"{short_dtype(d)}: {n:,}" for d, n in counts.most_common())
        for n, p in params:
            if p.is_floating_point() and p.dtype != main:
                ck.find("dtype", "dtype-mismatch", "warning", n,
                        f"parameter is {short_dtype(p.dtype)} while the model is {short_dtype(main)} "
                        f"(params per dtype: {mix})",
                        f"create it as {short_dtype(main)} (torch.from_numpy gives float64; use .float()) or cast "
                        f"the whole model once with model.to({short_dtype(main)})",
                        verdict=f"mixed parameter dtypes ({mix})")
    for label, t in inputs.tensors():
        if t.is_floating_point() and t.dtype != main:
            ck.find("dtype", "dtype-mismatch", "error", label,
                    f"input is {short_dtype(t.dtype)} but the parameters are {short_dtype(main)}",
                    f"cast the input with .to({short_dtype(main)}) in the data pipeline (or the model to "
                    f"{short_dtype(t.dtype)})",
                    verdict=f"{label} is {short_dtype(t.dtype)}, parameters are {short_dtype(main)}")
    if "dtype" not in ck.rows:
        ck.row("dtype", "ok", f"all {short_dtype(main)}")
    return short_dtype(main)


def check_promotion(eval_out, main_dtype: str | None, ck: Checklist) -> None:
    """Silent dtype promotion: a float64 parameter turns a float32 model's output float64; the
    minority-dtype warnings then become errors."""
    outs = [t for _, t in tensors(eval_out) if t.is_floating_point()]
    if not main_dtype or not outs or short_dtype(outs[0].dtype) == main_dtype:
        return
    odt = short_dtype(outs[0].dtype)
    minority = [f for f in ck.result.findings if f.code == "dtype-mismatch" and f.severity == "warning"]
    for f in minority:
        f.severity = "error"
        f.message += f"; it silently promotes the output to {odt}"
    if minority:
        ck.rows["dtype"].update(status="error",
                                verdict=f"the output is {odt} while the parameters are mostly {main_dtype}: "
                                        f"{', '.join(f.where for f in minority[:3])} promote(s) it")
