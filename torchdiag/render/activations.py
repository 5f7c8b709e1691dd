"""Pictures of `activations`: the feature maps and filters the diagnostic describes
(result.artefacts["drawings"]), drawn for TensorBoard and as PNG files (`--images DIR`).

Each picture is one labelled figure (the same array for the PNG and TensorBoard): a title naming the
command, layer and model, the tiles enlarged (nearest) to ≥ 32 px with each channel's index above it
(filters-by-input grids: output filter at the left, input channel above), and a colour bar with the
value scale (feature maps: one scale shared by all channels, so a dead channel looks dark; gray
filters: the weight, ±max|w|). RGB filters have no colour bar: their colours are the three weights."""
from __future__ import annotations

from . import images as im
from .images import record_pictures, write_pictures

TEXT = {"fontsize": 8, "color": "#111111"}
NONFINITE = (255, 0, 255)      # NaN/Inf pixels of a feature map: magenta, a colour viridis never takes


def _tiles(d):
    """(tiles as HxWx3 uint8 at their enlarged size, colour bar or None) for one drawing."""
    np = __import__("numpy")
    kind, planes = d["kind"], d["planes"]
    if kind == "feature_maps":
        finite = [p[np.isfinite(p)] for p in planes]
        values = np.concatenate([v.ravel() for v in finite]) if finite else np.zeros(0)
        lo, hi = (float(values.min()), float(values.max())) if values.size else (0.0, 0.0)
        tiles = [im.colorize(im.normalize01(p, lo, hi)) for p in planes]
        for t, p in zip(tiles, planes):
            t[~np.isfinite(p)] = NONFINITE
        bar = {"cmap": "viridis", "vmin": lo, "vmax": hi, "label": "activation"}
    elif kind == "rgb":
        tiles, bar = [im.to_rgb_uint8(p) for p in planes], None
    else:
        m = d["wmax"]
        tiles, bar = [im.gray(p) for p in planes], {"cmap": "gray", "vmin": -m, "vmax": m, "label": "weight"}
    return [im.upscale(t, d["scale"]) for t in tiles], bar


def _scale_words(d) -> str:
    """Non-finite values, which the colour bar cannot show (magenta in the picture)."""
    if d["kind"] != "feature_maps":
        return ""
    np = __import__("numpy")
    bad = sum(int((~np.isfinite(p)).sum()) for p in d["planes"])
    return f" · {bad} NaN/Inf in magenta" if bad else ""


def picture(result, d):
    """One drawing as a labelled figure: (HxWx3 uint8, PNG text)."""
    from ..pictures import LABEL_PX, PAD, ROW_LABEL_PX

    tiles, bar = _tiles(d)
    what = "feature maps" if d["kind"] == "feature_maps" else "filters"
    title = f"activations · layer {d['layer']} · {what}"
    subtitle = f"{im.model_name(result)} · {d['caption']}{_scale_words(d)}"
    if d["cols"] is None:                  # one tile per channel or filter: its index above it
        grid, texts = im.indexed_grid(tiles, None, d["labels"])
        img = im.framed(grid, title, subtitle, bar, texts=texts)
    else:                                  # output filter × input channel: rows and columns named
        h, w = tiles[0].shape[:2]
        grid = im.tile(tiles, d["cols"])
        texts = [(-6, r * (h + PAD) + h / 2, label, {**TEXT, "ha": "right", "va": "center"})
                 for r, label in enumerate(d["labels"])]
        texts += [(c * (w + PAD) + w / 2, -2, str(c), {**TEXT, "ha": "center", "va": "bottom"}) for c in range(d["cols"])]
        img = im.framed(grid, title, subtitle, bar, left=ROW_LABEL_PX, top=LABEL_PX, texts=texts)
    scale = f"shared colour scale {bar['vmin']:.4g} … {bar['vmax']:.4g}" if d["kind"] == "feature_maps" else (
        f"weights scaled by ±{d['wmax']:.4g}")
    text = im.png_text(result, d["layer"], title, f"{subtitle}; {scale}; tiles enlarged ×{d['scale']} (nearest)",
                       kind=what)
    return img, text


def draw(result) -> None:
    """Each described picture as a labelled figure: into result.images (tb) and artefacts["pictures"] (images)."""
    a = result.artefacts
    for d in a.get("drawings", []):
        img, text = picture(result, d)
        tag = "feature_maps" if d["kind"] == "feature_maps" else "filters"
        if a.get("tb"):
            result.images[f"activations/{d['layer']}/{tag}"] = img
        if a.get("images"):
            a.setdefault("pictures", []).append((f"{im.safe_name(d['layer'])}_{d['suffix']}.png", img, text))


def write_images(result, path) -> str:
    """<layer>_features.png and <layer>_filters.png in folder `path`; returns the folder."""
    im.drawn(result)
    return write_pictures(result, path, "--images")


def record(result, written: dict) -> None:
    """The CLI's render_extra: the paths written go into the JSON entries and the summary."""
    record_pictures(result, written.get("images"), at=0)


# the files this command writes, by the kind its caller asks for (RenderSpec.outputs)
WRITERS = {"images": write_images}
