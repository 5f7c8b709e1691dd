"""Picture facts shared by the diagnostics and render/ (stdlib only): the geometry of a picture, known
before it is drawn (a diagnostic reports the sizes of the pictures it describes; render/ draws them to
exactly those sizes), and whether the plotting libraries are installed."""
from __future__ import annotations

import math

from .errors import UsageError

PAD = 2                  # pixels between tiles of a grid
PAD_VALUE = 255          # white separators

# attention: one row of per-head heatmaps per layer
ATTENTION_DPI = 100
ATTENTION_HEAD_INCHES = 2.6
MAX_HEADS_DRAWN = 16
MAX_LABELLED = 64        # longest sequence whose axes get token labels (more would not be legible)

PCA_SIZE = (400, 400)    # embeddings: pixels (height, width) of the PCA preview
PICTURE_MIN = 128        # gradcam: the shorter side of each panel is enlarged (nearest) to at least this


def scale_for(h: int, w: int, target: int = 48) -> int:
    """Integer factor that makes the larger side of an h×w tile at least `target` pixels."""
    return max(1, -(-target // max(h, w, 1)))


def grid_shape(n: int, h: int, w: int, cols: int | None = None, pad: int = PAD) -> tuple[int, int, int, int]:
    """(rows, cols, height, width) of a grid of n tiles of h×w; cols defaults to ceil(sqrt(n)).
    Size: rows*h + (rows-1)*pad by cols*w + (cols-1)*pad."""
    cols = min(cols or math.ceil(math.sqrt(n)), n)
    rows = math.ceil(n / cols)
    return rows, cols, rows * h + (rows - 1) * pad, cols * w + (cols - 1) * pad


def attention_size(heads: int) -> tuple[int, int]:
    """(height, width) in pixels of one attention layer's picture."""
    shown = min(heads, MAX_HEADS_DRAWN)
    return int(round(3.0 * ATTENTION_DPI)), int(round((ATTENTION_HEAD_INCHES * shown + 0.8) * ATTENTION_DPI))


def need_pictures(what: str = "writing pictures", libraries=("matplotlib", "PIL")) -> None:
    """Exit 2 with a clear message when matplotlib or Pillow is missing. Asked of the import system,
    not by importing them: matplotlib costs ~0.6 s, and this runs before any work."""
    import importlib.util

    for name in libraries:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise UsageError(f"{what} needs {'pillow' if name == 'PIL' else name}, which is not installed",
                             hint="install the plot extra: pip install 'torchdiag[plot]' (matplotlib and pillow)")


def layout(shape: tuple[int, ...]) -> str | None:
    """Where the channels of one sample are: 'chw' (C in 1/3/4 first, H, W ≥ 4), 'hwc', or None."""
    if len(shape) == 3 and shape[0] in (1, 3, 4) and min(shape[1:]) >= 4:
        return "chw"
    if len(shape) == 3 and shape[-1] in (1, 3, 4) and min(shape[:2]) >= 4:
        return "hwc"
    if len(shape) == 2 and min(shape) >= 4:
        return "hw"   # one grey channel
    return None
