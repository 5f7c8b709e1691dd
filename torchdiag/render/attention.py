"""Pictures of `attention`: one row of per-head heatmaps per layer, drawn from the weights the
diagnostic returns (result.artefacts["heatmaps"]), for TensorBoard and as PNG files (`--images DIR`)."""
from __future__ import annotations

from ..pictures import ATTENTION_DPI as DPI
from ..pictures import MAX_HEADS_DRAWN, MAX_LABELLED, attention_size
from .images import record_pictures, write_pictures


def heatmaps(w, title: str, tokens=None):
    """H×L×S weights of one sample → one row of per-head heatmaps (shared 0…max colour scale)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    from .images import figure_to_array

    heads = min(w.shape[0], MAX_HEADS_DRAWN)
    h_px, w_px = attention_size(w.shape[0])
    fig = Figure(figsize=(w_px / DPI, h_px / DPI), dpi=DPI)
    vmax = float(w[:heads].max()) or 1.0
    L, S = w.shape[-2], w.shape[-1]
    axes = fig.subplots(1, heads, squeeze=False)[0]
    fig.subplots_adjust(left=0.05, right=0.92, top=0.85, bottom=0.12, wspace=0.35)
    im = None
    for h, ax in enumerate(axes):
        im = ax.imshow(w[h], cmap="viridis", vmin=0.0, vmax=vmax, interpolation="nearest", aspect="auto")
        ax.set_title(f"head {h}", fontsize=8)
        if tokens is not None and max(L, S) <= MAX_LABELLED:
            fs = max(3, min(7, int(160 / max(L, S))))
            if len(tokens) == S:
                ax.set_xticks(range(S))
                ax.set_xticklabels(tokens, rotation=90, fontsize=fs)
            if len(tokens) == L:
                ax.set_yticks(range(L))
                ax.set_yticklabels(tokens if h == 0 else [""] * L, fontsize=fs)
        else:
            ax.tick_params(labelsize=6)
    fig.suptitle(f"{title}  (rows: queries, columns: keys)" + (f"  first {heads} of {w.shape[0]} heads" if w.shape[0] > heads else ""),
                 fontsize=9)
    cax = fig.add_axes([0.935, 0.12, 0.012, 0.73])
    fig.colorbar(im, cax=cax).ax.tick_params(labelsize=6)
    return figure_to_array(fig)


def draw(result) -> None:
    """Each layer's picture: into result.images (tb) and artefacts["pictures"] (images)."""
    from .images import safe_name

    a = result.artefacts
    for key, w in a.get("heatmaps", []):
        img = heatmaps(w, key, a.get("tokens"))
        if a.get("tb"):
            result.images[f"attention/{key}"] = img
        if a.get("images"):
            a.setdefault("pictures", []).append((f"attention_{safe_name(key)}.png", img))


def write_images(result, path) -> str:
    """attention_<layer>.png in folder `path`; returns the folder."""
    from .images import drawn

    drawn(result)
    return write_pictures(result, path, "--images")


def record(result, written: dict) -> None:
    """The CLI's render_extra: the paths written go into the JSON entries and the summary."""
    record_pictures(result, written.get("images"), what=f" (sample {result.artefacts.get('sample', 0)})")


# the files this command writes, by the kind its caller asks for (RenderSpec.outputs)
WRITERS = {"images": write_images}
