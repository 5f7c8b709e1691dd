"""Input statistics: non-finite-input, unnormalised-input (image-like float input in [0, 255]; info when the model
scales it before any weighted layer reads it)."""
from __future__ import annotations

from .checklist import Checklist
from .shared import short_dtype

SCALED = 5.0   # a weighted layer seeing |x| ≤ this: the input was scaled (normalised data spans a few std)
AFFINE = 0.99  # the first one's input correlates with the raw input at least this much: scaled, not squashed


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


class Seen:
    """What the weighted layers (modules holding a parameter of ≥ 2 dims: a matmul or a convolution, whose output's
    scale follows its input's) received with the raw input's number of values, at their first call, in call order:
    (module, largest |x|, correlation with the raw input). Scaled: every such layer sees |x| ≤ SCALED and the first
    one an affine image of the input (correlation ≥ AFFINE: x / 255 - 0.5 or a per-channel Normalize, not a
    squashing tanh or clamp, not another tensor of the same size, not a constant)."""

    def __init__(self, layers: list[tuple[str, float, float]]):
        self.layers = layers

    def scaled(self) -> bool:
        return bool(self.layers) and all(m <= SCALED for _, m, _ in self.layers) and self.layers[0][2] >= AFFINE

    def describe(self) -> str:
        name, most, corr = self.layers[0]
        raw = [n for n, m, _ in self.layers if m > SCALED]
        first = f"its first weighted layer, {name or '(root)'}, sees |x| ≤ {most:.4g} (correlation {corr:.3g} with the input)"
        return first + (f"; {raw[0] or '(root)'} sees the raw range" if raw and raw[0] != name else "")


def weighted_inputs(work, inputs, ctx, image) -> Seen | None:
    """Seen, from one eval forward under no_grad (one read at the end): the weighted layers' first inputs of
    `image`'s number of values; None when the forward raises (its error comes later)."""
    import torch

    raw = image.detach().reshape(-1).float().clone()   # before a forward that might edit the input in place
    weighted = {m for m in work.modules() if any(p.dim() >= 2 for p in m.parameters(recurse=False))}
    names = {m: n for n, m in work.named_modules()}
    layers: dict = {}

    def pre(module, args, kwargs):
        if module in layers:
            return
        vals = [a for a in (*args, *kwargs.values()) if torch.is_tensor(a) and a.is_floating_point()]
        x = next((a for a in vals if a.numel() == raw.numel()), None)
        if x is not None:
            v = x.detach().reshape(-1).float()
            corr = torch.corrcoef(torch.stack([raw.to(v.device), v]))[0, 1]
            layers[module] = torch.stack([v.abs().amax(), torch.nan_to_num(corr, nan=0.0)])

    handles = [m.register_forward_pre_hook(pre, with_kwargs=True) for m in weighted]
    try:
        work.eval()
        with torch.no_grad(), ctx.autocast():
            inputs.call(work)
    except Exception:   # the eval forward below names it
        return None
    finally:
        for h in handles:
            h.remove()
    if not layers:
        return Seen([])
    read = torch.stack([t.to(raw.device) for t in layers.values()]).tolist()
    return Seen([(names.get(m, "?"), most, corr) for m, (most, corr) in zip(layers, read)])


def image_like(t) -> bool:
    if t.dim() == 4:
        return t.shape[1] in (1, 3, 4) or t.shape[-1] in (1, 3, 4)
    if t.dim() == 3:
        return t.shape[0] in (1, 3, 4) and min(t.shape[1:]) >= 8
    return False
