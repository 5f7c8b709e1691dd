"""Files of `data`: `--images DIR` (a grid of sample inputs per class for each split, PNG) and
`--plot FILE` (the label histogram and the per-channel value histograms in one figure)."""
from __future__ import annotations

from pathlib import Path

from ..pictures import PAD, layout, scale_for
from .images import normalize01, tile, upscale
from .output import atomic_path
from .plots import pyplot, save

MAX_ROWS = 20     # classes shown in the sample grid



def _rgb(x, lo: float, hi: float):
    """One sample (chw, hwc or hw) → HxWx3 uint8, scaled with the field's own range."""
    import numpy as np

    kind = layout(tuple(x.shape))
    if kind == "chw":
        x = np.moveaxis(x, 0, -1)
    elif kind == "hw":
        x = x[..., None]
    x = normalize01(x, lo, hi)
    if x.shape[-1] == 1:
        x = np.repeat(x, 3, axis=-1)
    return (x[..., :3] * 255 + 0.5).astype(np.uint8)


def _grid(gallery: dict, per_class: int, lo: float, hi: float):
    """(HxWx3 uint8 grid, row labels, tile size): a row per class (at most MAX_ROWS), per_class columns."""
    import numpy as np

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


def draw(result) -> None:
    """The sample grid of each split (render.images.drawn calls this once): into the gallery entry (PNG) and
    result.images (TensorBoard)."""
    for split, g in result.artefacts.get("gallery", {}).items():
        g["grid"], g["rows"], g["tile"] = _grid(g["samples"], g["per_class"], *g["range"])
        result.images[f"data/{split}/samples_per_class"] = g["grid"]


def write_images(result, path) -> str:
    """samples_<split>.png in folder `path`: one row per class (labelled), sample inputs across; returns the folder,
    or "" where no split has samples to show (no input laid out as images: nothing written, not even the folder)."""
    from .images import drawn

    if not result.artefacts.get("gallery"):
        return ""
    drawn(result)
    plt = pyplot()
    folder = Path(path)
    for split, g in result.artefacts.get("gallery", {}).items():
        img, rows = g["grid"], g["rows"]
        h = g["tile"][0]
        fig_h = max(2.0, img.shape[0] / 60 + 0.8)
        fig, ax = plt.subplots(figsize=(max(3.0, img.shape[1] / 60 + 1.2), fig_h), dpi=100)
        try:
            ax.imshow(img, interpolation="nearest")
            ax.set_yticks([i * (h + 2) + h / 2 for i in range(len(rows))])
            ax.set_yticklabels(rows, fontsize=8)
            ax.set_ylabel(f"class (target {g.get('target')})" if rows != ["all"] else "samples", fontsize=8)
            ax.set_xticks([])
            ax.set_title(f"data {split}: sample inputs ({g['field']}), one row per class", fontsize=9)
            fig.tight_layout()
            with atomic_path(folder / f"samples_{split}.png", "--images") as tmp:
                fig.savefig(tmp)
        finally:
            plt.close(fig)
    return str(folder)


def write_plot(result, path) -> str:
    """The label histogram per split and each input field's per-channel value histograms; returns the path."""
    plt = pyplot()
    splits = result.data.get("splits", {})
    labels = {s: d["labels"] for s, d in splits.items() if d.get("labels")}
    channels = result.artefacts.get("channels", {})
    panels = (1 if labels else 0) + len(channels)
    fig, axes = plt.subplots(max(panels, 1), 1, figsize=(7, 2.8 * max(panels, 1)), dpi=100, squeeze=False)
    try:
        i = 0
        if labels:
            ax = axes[i][0]
            i += 1
            width = 0.8 / len(labels)
            for j, (split, lab) in enumerate(labels.items()):
                keys = list(lab["counts"])
                xs = [k + j * width for k in range(len(keys))]
                ax.bar(xs, [lab["counts"][k] for k in keys], width=width, label=f"{split} ({lab['field']})")
                ax.set_xticks([k + 0.4 - width / 2 for k in range(len(keys))])
                ax.set_xticklabels(keys, fontsize=7, rotation=90 if len(keys) > 20 else 0)
            ax.set_xlabel("class")
            ax.set_ylabel("samples")
            ax.set_title("label histogram", fontsize=9)
            ax.set_ylim(top=1.3 * max(max(lab["counts"].values()) for lab in labels.values()))   # room for the legend
            ax.legend(fontsize=7, loc="upper right")
        for name, values in channels.items():
            ax = axes[i][0]
            i += 1
            for c, v in enumerate(values):
                ax.hist(v, bins=50, histtype="step", label=f"channel {c}" if len(values) > 1 else "values")
            ax.set_xlabel("value")
            ax.set_ylabel("count (sampled values)")
            ax.set_title(f"{name}: values per channel", fontsize=9)
            ax.legend(fontsize=7)
        if not panels:
            axes[0][0].text(0.5, 0.5, "no labels and no image-like input to draw", ha="center", va="center")
            axes[0][0].set_axis_off()
        fig.tight_layout()
    except BaseException:
        plt.close(fig)
        raise
    return save(fig, path)


# the files this command writes, by the kind its caller asks for (RenderSpec.outputs)
WRITERS = {"images": write_images, "plot": write_plot}
