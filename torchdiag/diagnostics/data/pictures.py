"""Pictures of the data as arrays (the renderers draw and write them): a grid of sample inputs per class
(one row per class), and the per-channel values kept for histograms."""
from __future__ import annotations

import numpy as np

from ...render.images import PAD, normalize01, scale_for, tile, upscale
from .stats import layout

MAX_ROWS = 20


def _rgb(x, lo: float, hi: float):
    """One sample (chw, hwc or hw) → HxWx3 uint8, scaled with the field's own range."""
    kind = layout(tuple(x.shape))
    if kind == "chw":
        x = np.moveaxis(x, 0, -1)
    elif kind == "hw":
        x = x[..., None]
    x = normalize01(x, lo, hi)
    if x.shape[-1] == 1:
        x = np.repeat(x, 3, axis=-1)
    return (x[..., :3] * 255 + 0.5).astype(np.uint8)


def grid(gallery: dict, per_class: int, lo: float, hi: float):
    """(HxWx3 uint8 grid, row labels, tile size): a row per class (at most MAX_ROWS), per_class columns."""
    keys = sorted(gallery, key=lambda k: (not isinstance(k, (int, float)), k if isinstance(k, (int, float)) else str(k)))
    keys = keys[:MAX_ROWS]
    first = next(iter(gallery[keys[0]]))
    h, w = _rgb(first, lo, hi).shape[:2]
    f = scale_for(h, w, 48)
    blank = np.full((h * f, w * f, 3), 255, dtype=np.uint8)
    cols = max(1, min(per_class, max(len(gallery[k]) for k in keys)))
    tiles = []
    for k in keys:
        row = [upscale(_rgb(x, lo, hi), f) for x in gallery[k] if x.shape == first.shape][:cols]
        row += [blank] * (cols - len(row))
        tiles += row
    return tile(tiles, cols=cols, pad=PAD), [str(k) for k in keys], (h * f, w * f)


def add_pictures(r, st) -> None:
    gal, channels = {}, {}
    for split, s in st.scans.items():
        inputs = [s.fields[n] for n in (s.roles.inputs if s.roles else []) if n in s.fields]
        if s.gallery and inputs and inputs[0].values:
            f = inputs[0]
            img, rows, size = grid(s.gallery, st.opts.per_class, f.lo, f.hi)
            gal[split] = {"grid": img, "rows": rows, "tile": size, "field": f.name, "target": s.roles.target}
            r.images[f"data/{split}/samples_per_class"] = img
        for f in s.fields.values():
            if f.role == "input" and f.reservoir:
                values = [np.asarray(v, dtype=np.float64) for v in f.reservoir]
                channels[f"{split}:{f.name}"] = values
                for c, v in enumerate(values):
                    r.histograms[f"data/{split}/{f.name}/channel_{c}"] = v
            if f.role == "target" and f.classes and f.integral:
                counts = [f.classes[c] for c in sorted(f.classes)]
                r.histograms[f"data/{split}/{f.name}/labels"] = np.repeat(np.array(sorted(f.classes), dtype=np.float64),
                                                                          np.minimum(counts, 10_000))
    r.artefacts["gallery"] = gal
    r.artefacts["channels"] = channels
