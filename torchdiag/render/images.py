"""Pictures: grids, heatmaps, overlays and PNG files from numpy arrays.

Every picture is an HxWx3 uint8 array (the same array goes to TensorBoard and to the PNG), so
sizes are exact and testable (their geometry is in torchdiag/pictures.py, which the diagnostics read
too). Colour maps, figures with labels and PNG encoding come from matplotlib/Pillow, an optional extra
(`pip install 'torchdiag[plot]'`): `need_pictures()` turns their absence into a usage error (exit 2)
before any model runs."""
from __future__ import annotations

from pathlib import Path

from ..pictures import (COLORBAR_MIN, FIGURE_DPI, LABEL_PX, MARGIN, PAD, PAD_VALUE, TITLE_PX, figure_size, grid_shape,
                        need_pictures)


def check_pictures(folder, tb: bool, what: str) -> None:
    """The CLI's checks before loading, for commands that draw: the --images folder, and the
    plotting libraries when pictures are asked for (--images or --tb)."""
    from .output import check_dir

    check_dir(folder, "--images")
    if folder is not None or tb:
        need_pictures(f"writing {what}")


def _np():
    import numpy as np

    return np


def normalize01(a, lo=None, hi=None):
    """Min-max scale to [0, 1] (float64); a constant array becomes zeros."""
    np = _np()
    a = np.asarray(a, dtype=np.float64)
    a = np.nan_to_num(a, nan=0.0, posinf=0.0, neginf=0.0)
    lo = float(a.min()) if lo is None else lo
    hi = float(a.max()) if hi is None else hi
    if hi - lo <= 0:
        return np.zeros_like(a)
    return np.clip((a - lo) / (hi - lo), 0.0, 1.0)


def colorize(a01, cmap: str = "viridis"):
    """[0,1] HxW → HxWx3 uint8 through a matplotlib colour map."""
    import matplotlib

    np = _np()
    rgba = matplotlib.colormaps[cmap](np.asarray(a01, dtype=np.float64))
    return (rgba[..., :3] * 255 + 0.5).astype(np.uint8)


def gray(a01):
    np = _np()
    g = (np.asarray(a01, dtype=np.float64) * 255 + 0.5).astype(np.uint8)
    return np.repeat(g[..., None], 3, axis=2)


def to_rgb_uint8(a01):
    """[0,1] HxWx3 float → uint8."""
    np = _np()
    return (np.clip(np.asarray(a01, dtype=np.float64), 0, 1) * 255 + 0.5).astype(np.uint8)


def upscale(img, factor: int):
    """Nearest-neighbour enlargement by an integer factor (keeps pixels crisp)."""
    np = _np()
    if factor <= 1:
        return img
    return np.repeat(np.repeat(img, factor, axis=0), factor, axis=1)


def tile(images, cols: int | None = None, pad: int = PAD, pad_value: int = PAD_VALUE):
    """Same-sized HxWx3 uint8 tiles → one grid; cols defaults to ceil(sqrt(n)).
    Size: rows*h + (rows-1)*pad by cols*w + (cols-1)*pad."""
    np = _np()
    n = len(images)
    if n == 0:
        raise ValueError("no tiles")
    h, w = images[0].shape[:2]
    rows, cols, height, width = grid_shape(n, h, w, cols, pad)
    grid = np.full((height, width, 3), pad_value, dtype=np.uint8)
    for i, im in enumerate(images):
        r, c = divmod(i, cols)
        grid[r * (h + pad): r * (h + pad) + h, c * (w + pad): c * (w + pad) + w] = im
    return grid


def overlay(rgb_uint8, heat01, alpha: float = 0.5, cmap: str = "jet"):
    """Heatmap blended over an image of the same size."""
    np = _np()
    heat = colorize(heat01, cmap).astype(np.float64)
    out = (1 - alpha) * rgb_uint8.astype(np.float64) + alpha * heat
    return np.clip(out + 0.5, 0, 255).astype(np.uint8)


def hstack(images, pad: int = PAD, pad_value: int = PAD_VALUE):
    return tile(images, cols=len(images), pad=pad, pad_value=pad_value)


def figure_to_array(fig):
    """A matplotlib figure (Agg canvas) → HxWx3 uint8 of exactly figsize*dpi pixels."""
    np = _np()
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    rgba = np.asarray(canvas.buffer_rgba())
    return rgba[..., :3].copy()


def png_bytes(img, text: dict | None = None) -> bytes:
    """HxWx3 (or HxW) uint8 → PNG file contents; `text` becomes PNG text chunks (tEXt, or iTXt
    for characters beyond Latin-1), readable back with PIL's `Image.open(path).text`."""
    import io

    from PIL import Image
    from PIL.PngImagePlugin import PngInfo

    info = None
    if text:
        info = PngInfo()
        for key, value in text.items():
            info.add_text(key, str(value))
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="PNG", pnginfo=info)
    return buf.getvalue()


def save_png(img, path, option: str = "--images", text: dict | None = None) -> Path:
    """Write HxWx3 (or HxW) uint8 as PNG (atomically, through render.output); creates the folder."""
    from .output import atomic_write

    return atomic_write(path, png_bytes(img, text), option)


def model_name(result) -> str:
    """The model as the run named it (the spec in the header), for titles."""
    return str(result.header.get("model") or "model given from Python")


def png_text(result, layer: str, title: str, description: str, **extra) -> dict:
    """The PNG text chunks of a picture: what a reader (or a test) can read back without looking."""
    text = {"Title": title, "Description": description, "Software": "torchdiag",
            "Command": result.command, "Model": model_name(result), "Layer": layer}
    text.update({key.replace("_", " ").capitalize(): str(value) for key, value in extra.items()})
    return text


def title_lines(fig, title: str, subtitle: str) -> None:
    """The two lines above every picture: the title (command · layer · what) in bold, then the model and
    what is shown. A line wider than the figure is shortened in the middle (…), measured, not guessed."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    W, H = fig.bbox.width, fig.bbox.height
    renderer = FigureCanvasAgg(fig).get_renderer()
    for y, text, options in ((5, title, {"fontsize": 10, "weight": "bold"}),
                             (25, subtitle, {"fontsize": 8, "color": "#333333"})):
        t = fig.text(MARGIN / W, 1 - y / H, text, va="top", **options)
        for _ in range(4):
            room = (W - 2 * MARGIN) / t.get_window_extent(renderer).width
            if room >= 1:
                break
            keep = max(8, int(len(text) * room) - 2)
            text = text[: keep // 2] + "…" + text[len(text) - (keep - keep // 2):]
            t.set_text(text)


def framed(picture, title: str, subtitle: str, colorbar: dict | None = None, left: int = MARGIN, top: int = 0,
           texts=()):
    """A picture (HxWx3 uint8) at 1:1 pixels in a figure with a two-line title above it and, for a
    heat map, a colour bar (`colorbar`: cmap, vmin, vmax, label) at its right. `texts`: (x, y, text,
    matplotlib text options) placed in the picture's pixel coordinates (y down; negative: above or left
    of it, inside the `left`/`top` margins). Size: pictures.figure_size."""
    from matplotlib.figure import Figure

    ph, pw = picture.shape[:2]
    H, W = figure_size(ph, pw, colorbar is not None, left, top)
    fig = Figure(figsize=(W / FIGURE_DPI, H / FIGURE_DPI), dpi=FIGURE_DPI, facecolor="white")
    y0 = TITLE_PX + top                                  # the picture's first row, from the top
    fig.figimage(picture, xo=left, yo=H - y0 - ph, origin="upper")   # pixels as they are: no resampling
    title_lines(fig, title, subtitle)
    for x, y, s, options in texts:
        fig.text((left + x) / W, 1 - (y0 + y) / H, s, **options)
    if colorbar is not None:
        from matplotlib.cm import ScalarMappable
        from matplotlib.colors import Normalize

        lo, hi = float(colorbar["vmin"]), float(colorbar["vmax"])
        bar_h = max(ph, COLORBAR_MIN)
        cax = fig.add_axes([(left + pw + 12) / W, (H - y0 - bar_h) / H, 14 / W, bar_h / H])
        bar = fig.colorbar(ScalarMappable(Normalize(lo, hi if hi > lo else lo + 1), colorbar["cmap"]), cax=cax)
        bar.ax.tick_params(labelsize=7)
        bar.set_label(colorbar["label"], fontsize=8)
    return figure_to_array(fig)


def indexed_grid(tiles, cols: int | None, labels):
    """Same-sized tiles in a grid with a white LABEL_PX strip above each row, and the (x, y, text,
    options) that put each tile's label in its strip, for framed(). Size: pictures.labelled_grid_size."""
    np = _np()
    h, w = tiles[0].shape[:2]
    strip = np.full((LABEL_PX, w, 3), PAD_VALUE, dtype=np.uint8)
    grid = tile([np.concatenate([strip, t]) for t in tiles], cols)
    cols = grid_shape(len(tiles), h, w, cols)[1]
    texts = []
    for i, label in enumerate(labels):
        r, c = divmod(i, cols)
        texts.append((c * (w + PAD), r * (h + LABEL_PX + PAD), str(label),
                      {"fontsize": 8, "va": "top", "ha": "left", "color": "#111111"}))
    return grid, texts


def safe_name(name: str) -> str:
    """A module path as a file name: `features.0` → `features.0`, `` → `model`."""
    import re

    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name) or "model"


def write_pictures(result, folder, option: str = "--images") -> str:
    """Every (file name, HxWx3 uint8[, PNG text]) in result.artefacts["pictures"] as a PNG in `folder`
    (created if missing), each written atomically. Returns the folder."""
    folder = Path(folder)
    for name, img, *text in result.artefacts.get("pictures", []):
        save_png(img, folder / name, option, text[0] if text else None)
    return str(folder)


def record_pictures(result, folder, at: int | None = None, what: str = "") -> None:
    """After write_pictures: each entry of result.data["images"] gets its file's "path", and the
    summary says where they went (inserted at `at`, appended when None)."""
    if folder is None:
        return
    entries = result.data.get("images") or []
    for entry, picture in zip(entries, result.artefacts.get("pictures", [])):
        entry["path"] = str(Path(folder) / picture[0])
    if entries:
        line = ("Pictures", f"{len(entries)} PNG file(s) in {folder}{what}")
        result.summary.insert(len(result.summary) if at is None else at, line)


def drawn(result) -> None:
    """The pictures a diagnostic described (as data: arrays, sizes) drawn once, by its renderer's
    draw(result) (its renderer in the registry), before they are written to PNG files or TensorBoard."""
    from ..commands import BY_NAME

    if result.artefacts.get("drawn"):
        return
    command = BY_NAME.get(result.command)
    module = command.renderer_module() if command is not None else None
    draw = getattr(module, "draw", None)
    if draw is not None:
        draw(result)
    result.artefacts["drawn"] = True
