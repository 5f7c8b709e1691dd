"""Input statistics: non-finite-input, unnormalised-input (image-like float input in [0, 255])."""
from __future__ import annotations

from .checklist import Checklist
from .shared import short_dtype


def input_stats(inputs, ck: Checklist) -> list[dict]:
    import torch

    rows = []
    for label, t in inputs.tensors():
        row = {"input": label, "shape": "x".join(map(str, t.shape)) or "scalar", "dtype": short_dtype(t.dtype),
               "min": None, "max": None, "mean": None, "std": None, "non_finite": None}
        rows.append(row)
        if t.device.type == "meta" or t.numel() == 0:
            continue
        x = t.detach()
        xf = x.double() if x.dtype != torch.bool else x.to(torch.float64)
        finite = torch.isfinite(xf)
        bad = int((~finite).sum())
        vals = xf[finite] if bad else xf.reshape(-1)
        row["non_finite"] = bad
        if vals.numel():
            row.update(min=float(vals.min()), max=float(vals.max()), mean=float(vals.mean()),
                       std=float(vals.std()) if vals.numel() > 1 else 0.0)
        if bad:
            ck.find("inputs", "non-finite-input", "error", label, f"{bad:,} of {x.numel():,} values are NaN/Inf",
                    "clean the data (torch.nan_to_num, or drop the samples) before it reaches the model")
        if x.is_floating_point() and image_like(x) and row["min"] is not None and row["min"] >= 0 and row["max"] > 2.0:
            ck.find("inputs", "unnormalised-input", "warning", label,
                    f"image-like float input with values in [{row['min']:g}, {row['max']:g}] (mean {row['mean']:.4g}): "
                    f"looks like raw pixel values, not normalised",
                    "scale to [0, 1] (ToTensor / x / 255) and normalise with the dataset mean/std (Normalize)")
    if "inputs" not in ck.rows:
        ck.row("inputs", "ok", f"{len(rows)} tensor(s), finite, no raw-pixel range"
               if rows and all(r["min"] is not None for r in rows) else f"{len(rows)} input tensor(s) (no values on meta)")
    return rows


def image_like(t) -> bool:
    if t.dim() == 4:
        return t.shape[1] in (1, 3, 4) or t.shape[-1] in (1, 3, 4)
    if t.dim() == 3:
        return t.shape[0] in (1, 3, 4) and min(t.shape[1:]) >= 8
    return False
