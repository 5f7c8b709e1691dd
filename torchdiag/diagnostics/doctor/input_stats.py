"""Input statistics: non-finite-input, unnormalised-input (image-like float input in [0, 255]; info when the model
scales it before any weighted layer reads it)."""
from __future__ import annotations

from ...core.device import wide_float
from ...core.input_scale import image_like
from ...core.masks import additive_mask
from .checklist import Checklist
from .shared import short_dtype


def input_stats(inputs, ck: Checklist) -> tuple[list[dict], list[tuple[str, dict, object]]]:
    """(one row of statistics per input tensor, the image-like float inputs in a raw-pixel range with the tensors):
    those are judged by raw_pixels once the first weighted layer's input is known."""
    import torch

    rows, raw = [], []
    for label, t in inputs.tensors():
        row = {"input": label, "shape": "x".join(map(str, t.shape)) or "scalar", "dtype": short_dtype(t.dtype),
               "min": None, "max": None, "mean": None, "std": None, "non_finite": None}
        rows.append(row)
        if t.device.type == "meta" or t.numel() == 0:
            continue
        x = t.detach()
        xf = x.to(wide_float(x.device))   # float32 on mps (no float64 there)
        finite = torch.isfinite(xf)
        bad = int((~finite).sum())
        vals = xf[finite] if bad else xf.reshape(-1)
        row["non_finite"] = bad
        if vals.numel():
            row.update(min=float(vals.min()), max=float(vals.max()), mean=float(vals.mean()),
                       std=float(vals.std()) if vals.numel() > 1 else 0.0)
        if bad and additive_mask(x):   # a sweep: a causal LM's 0/-inf mask input failed doctor
            ck.find("inputs", "inf-input", "info", label, f"{bad:,} of {x.numel():,} values are -inf, every other one "
                    "≤ 0: an additive attention mask, it seems; whether the model stays finite is the forward's "
                    "and the training step's rows", "")
        elif bad:
            ck.find("inputs", "non-finite-input", "error", label, f"{bad:,} of {x.numel():,} values are NaN/Inf",
                    "clean the data (torch.nan_to_num, or drop the samples) before it reaches the model")
        if x.is_floating_point() and image_like(x) and row["min"] is not None and row["min"] >= 0 and row["max"] > 2.0:
            raw.append((label, row, t))
    return rows, raw


def raw_pixels(rows: list[dict], raw: list[tuple[str, dict, object]], seen, ck: Checklist) -> None:
    """unnormalised-input for each raw-pixel input: a warning, or info when the model scales its only float input
    before any weighted layer reads it (`seen`: what weighted_inputs recorded, or None when unknown)."""
    floats = [r for r in rows if r["dtype"].startswith(("float", "bfloat", "half"))]
    for label, row, _ in raw:
        message = f"image-like float input with values in [{row['min']:g}, {row['max']:g}] (mean {row['mean']:.4g})"
        if seen is not None and len(floats) == 1 and seen.scaled():
            ck.find("inputs", "unnormalised-input", "info", label,
                    f"{message}, scaled inside the model: {seen.describe()}", "nothing to do: the model scales its input itself")
        else:
            ck.find("inputs", "unnormalised-input", "warning", label,
                    f"{message}: looks like raw pixel values, not normalised"
                    + (f" ({seen.describe()})" if seen is not None and seen.layers else ""),
                    "scale to [0, 1] (ToTensor / x / 255) and normalise with the dataset mean/std (Normalize)")
    if "inputs" not in ck.rows:
        ck.row("inputs", "ok", f"{len(rows)} tensor(s), finite, no raw-pixel range"
               if rows and all(r["min"] is not None for r in rows) else f"{len(rows)} input tensor(s) (no values on meta)")
