"""Pictures: grids, heatmaps, overlays and PNG files from numpy arrays.

Every picture is an HxWx3 uint8 array (the same array goes to TensorBoard and to the PNG), so
sizes are exact and testable (their geometry is in torchdiag/pictures.py, which the diagnostics read
too). Colour maps, figures with labels and PNG encoding come from matplotlib/Pillow, an optional extra
(`pip install 'torchdiag[plot]'`): `need_pictures()` turns their absence into a usage error (exit 2)
before any model runs."""
from __future__ import annotations

from pathlib import Path

from ..pictures import PAD, PAD_VALUE, grid_shape, need_pictures


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


def png_bytes(img) -> bytes:
    """HxWx3 (or HxW) uint8 → PNG file contents."""
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="PNG")
    return buf.getvalue()


def save_png(img, path, option: str = "--images") -> Path:
    """Write HxWx3 (or HxW) uint8 as PNG (atomically, through render.output); creates the folder."""
    from .output import atomic_write

    return atomic_write(path, png_bytes(img), option)


def safe_name(name: str) -> str:
    """A module path as a file name: `features.0` → `features.0`, `` → `model`."""
    import re

    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name) or "model"


def write_pictures(result, folder, option: str = "--images") -> str:
    """Every (file name, HxWx3 uint8) pair in result.artefacts["pictures"] as a PNG in `folder`
    (created if missing), each written atomically. Returns the folder."""
    folder = Path(folder)
    for name, img in result.artefacts.get("pictures", []):
        save_png(img, folder / name, option)
    return str(folder)


def record_pictures(result, folder, at: int | None = None, what: str = "") -> None:
    """After write_pictures: each entry of result.data["images"] gets its file's "path", and the
    summary says where they went (inserted at `at`, appended when None)."""
    if folder is None:
        return
    entries = result.data.get("images") or []
    for entry, (name, _) in zip(entries, result.artefacts.get("pictures", [])):
        entry["path"] = str(Path(folder) / name)
    if entries:
        line = ("Pictures", f"{len(entries)} PNG file(s) in {folder}{what}")
        result.summary.insert(len(result.summary) if at is None else at, line)


def drawn(result) -> None:
    """The pictures a diagnostic described (as data: arrays, sizes) drawn once, by its renderer's
    draw(result) (render/<command>.py), before they are written to PNG files or TensorBoard."""
    import importlib

    if result.artefacts.get("drawn"):
        return
    try:
        module = importlib.import_module(f"{__package__}.{result.command.replace('-', '_')}")
    except ModuleNotFoundError:
        module = None
    draw = getattr(module, "draw", None)
    if draw is not None:
        draw(result)
    result.artefacts["drawn"] = True
