"""Pictures of `attention`: one row of per-head heatmaps per layer, drawn from the weights the
diagnostic returns (result.artefacts["heatmaps"]), for TensorBoard and as PNG files (`--images DIR`)."""
from __future__ import annotations

from ..pictures import ATTENTION_DPI as DPI
from ..pictures import MAX_HEADS_DRAWN, MAX_LABELLED, attention_size
from .images import record_pictures, write_pictures


def heatmaps(w, title: str, subtitle: str, tokens=None):
    """H×L×S weights of one sample → one row of per-head heatmaps (shared 0…max colour scale), under a
    two-line title, with the colour bar at the right."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    from ..pictures import TITLE_PX
    from .images import figure_to_array, title_lines

    heads = min(w.shape[0], MAX_HEADS_DRAWN)
    h_px, w_px = attention_size(w.shape[0])
    fig = Figure(figsize=(w_px / DPI, h_px / DPI), dpi=DPI)
    vmax = float(w[:heads].max()) or 1.0
    L, S = w.shape[-2], w.shape[-1]
    axes = fig.subplots(1, heads, squeeze=False)[0]
    top = 1 - (TITLE_PX + 20) / h_px              # the title lines, then each head's name
    fig.subplots_adjust(left=0.05, right=0.92, top=top, bottom=40 / h_px, wspace=0.35)
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
    title_lines(fig, title, subtitle)
    cax = fig.add_axes([0.935, 40 / h_px, 0.012, top - 40 / h_px])
    bar = fig.colorbar(im, cax=cax)
    bar.ax.tick_params(labelsize=6)
    bar.set_label("attention weight", fontsize=7)
    return figure_to_array(fig)


def words(result, key: str, heads: int) -> tuple[str, str]:
    """(title, subtitle) of one layer's picture."""
    from .images import model_name

    shown = f" · first {MAX_HEADS_DRAWN} of {heads} heads" if heads > MAX_HEADS_DRAWN else ""
    return (f"attention · layer {key} · sample {result.artefacts.get('sample', 0)}",
            f"{model_name(result)} · rows: queries, columns: keys{shown}")


def draw(result) -> None:
    """Each layer's picture: into result.images (tb) and artefacts["pictures"] (images)."""
    from .images import png_text, safe_name

    a = result.artefacts
    for key, w in a.get("heatmaps", []):
        title, subtitle = words(result, key, w.shape[0])
        img = heatmaps(w, title, subtitle, a.get("tokens"))
        if a.get("tb"):
            result.images[f"attention/{key}"] = img
        if a.get("images"):
            text = png_text(result, key, title, f"{subtitle}; colour: attention weight 0 … {float(w.max()):.4g}",
                            sample=a.get("sample", 0), heads=w.shape[0])
            a.setdefault("pictures", []).append((f"attention_{safe_name(key)}.png", img, text))


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
