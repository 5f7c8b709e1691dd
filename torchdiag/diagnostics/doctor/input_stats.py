"""Input statistics: non-finite-input, unnormalised-input (image-like float input in [0, 255] that reaches the
model's first weighted layer so: a model that scales its input itself is told so, as info)."""
from __future__ import annotations

from .checklist import Checklist
from .shared import short_dtype

SCALED = 5.0   # the first weighted layer seeing |x| ≤ this: the input was scaled (normalised data spans a few std)


def input_stats(inputs, ck: Checklist) -> tuple[list[dict], list[tuple[str, dict, int]]]:
    """(one row of statistics per input tensor, the image-like float inputs in a raw-pixel range with their sizes):
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
            raw.append((label, row, x.numel()))
    return rows, raw


def raw_pixels(rows: list[dict], raw: list[tuple[str, dict, int]], seen, ck: Checklist) -> None:
    """unnormalised-input for each raw-pixel input: a warning, or info when the model's only float input reaches
    its first weighted layer scaled elementwise (`seen`: (module, lowest, highest, size) of that layer's input, the
    same number of values as the input's; None when unknown)."""
    floats = [r for r in rows if r["dtype"].startswith(("float", "bfloat", "half"))]
    for label, row, size in raw:
        scaled = (seen is not None and len(floats) == 1 and seen[3] == size
                  and max(abs(seen[1]), abs(seen[2])) <= SCALED)
        message = f"image-like float input with values in [{row['min']:g}, {row['max']:g}] (mean {row['mean']:.4g})"
        if scaled:
            ck.find("inputs", "unnormalised-input", "info", label,
                    f"{message}, scaled inside the model: its first weighted layer, {seen[0] or '(root)'}, sees "
                    f"[{seen[1]:.4g}, {seen[2]:.4g}]", "nothing to do: the model scales its input itself")
        else:
            ck.find("inputs", "unnormalised-input", "warning", label,
                    f"{message}: looks like raw pixel values, not normalised"
                    + (f" (its first weighted layer, {seen[0] or '(root)'}, sees [{seen[1]:.4g}, {seen[2]:.4g}])"
                       if seen is not None and seen[3] == size else ""),
                    "scale to [0, 1] (ToTensor / x / 255) and normalise with the dataset mean/std (Normalize)")
    if "inputs" not in ck.rows:
        ck.row("inputs", "ok", f"{len(rows)} tensor(s), finite, no raw-pixel range"
               if rows and all(r["min"] is not None for r in rows) else f"{len(rows)} input tensor(s) (no values on meta)")


def first_weighted_input(work, inputs, ctx):
    """(module name, lowest, highest, number of values) of the floating-point input of the first module, in call order, that holds
    a parameter of ≥ 2 dimensions (a matmul or convolution: its output's scale follows its input's), from one
    eval forward under no_grad (one read); None when there is none or the forward raises (its error comes later)."""
    import torch

    weighted = {m for m in work.modules() if any(p.dim() >= 2 for p in m.parameters(recurse=False))}
    names = {m: n for n, m in work.named_modules()}
    first: list = []

    def pre(module, args):
        x = next((a for a in args if torch.is_tensor(a) and a.is_floating_point() and a.numel()), None)
        if x is not None and not first:
            first.append((names.get(module, "?"), torch.stack([x.detach().min(), x.detach().max()]).float(), x.numel()))

    handles = [m.register_forward_pre_hook(pre) for m in weighted]
    try:
        work.eval()
        with torch.no_grad(), ctx.autocast():
            inputs.call(work)
    except Exception:   # the eval forward below names it
        return None
    finally:
        for h in handles:
            h.remove()
    if not first:
        return None
    lo, hi = first[0][1].tolist()
    return first[0][0], lo, hi, first[0][2]


def image_like(t) -> bool:
    if t.dim() == 4:
        return t.shape[1] in (1, 3, 4) or t.shape[-1] in (1, 3, 4)
    if t.dim() == 3:
        return t.shape[0] in (1, 3, 4) and min(t.shape[1:]) >= 8
    return False
