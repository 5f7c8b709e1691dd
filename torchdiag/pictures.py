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
ATTENTION_INCHES = 3.3   # height: two title lines, head names, heatmaps, token labels
MAX_HEADS_DRAWN = 16
MAX_LABELLED = 64        # longest sequence whose axes get token labels (more would not be legible)

PCA_SIZE = (400, 400)    # embeddings: pixels (height, width) of the PCA preview
PICTURE_MIN = 192        # gradcam: the shorter side of each panel is enlarged (nearest) to at least this

# labelled figures (activations, gradcam): the picture at 1:1 pixels inside a frame of text
FIGURE_DPI = 100
TITLE_PX = 46            # two lines above the picture: command · layer, then the model and what is shown
MARGIN = 10              # blank border left, right (without a colorbar) and below
COLORBAR_PX = 84         # gap, colour bar and its tick labels right of the picture
COLORBAR_MIN = 120       # a picture with a colour bar is framed at least this tall (readable ticks)
MIN_WIDTH = 480          # room for the title lines
LABEL_PX = 14            # strip above each row of tiles: the channel index of each tile
ROW_LABEL_PX = 44        # left margin naming the rows (output filter) of a filters-by-input grid
TILE_MIN = 32            # every tile of a feature-map or filter grid is at least this many pixels a side
PANEL_GAP = 10           # gradcam: between its three panels
PANEL_LABEL_PX = 16      # gradcam: the name above each panel


def scale_for(h: int, w: int, target: int = 48, least: int = 0, most: int = 0) -> int:
    """Integer factor that makes the larger side of an h×w tile at least `target` pixels and the
    smaller at least `least`, without making the larger side exceed `most` (when given)."""
    f = max(1, -(-target // max(h, w, 1)), -(-least // max(min(h, w), 1)))
    return max(1, min(f, most // max(h, w, 1))) if most else f


def tile_scale(h: int, w: int, target: int = 48) -> int:
    """Enlargement of a grid tile: the larger side ≥ target, both ≥ TILE_MIN (up to 1024 px)."""
    return scale_for(h, w, target, TILE_MIN, 1024)


def figure_size(height: int, width: int, colorbar: bool, left: int = MARGIN, top: int = 0) -> tuple[int, int]:
    """(height, width) of a labelled figure around a height×width picture: title band (and `top` more
    for column labels) above, `left` pixels before it, a colour bar band or a margin after it."""
    body = max(height, COLORBAR_MIN) if colorbar else height
    return (TITLE_PX + top + body + MARGIN,
            max(MIN_WIDTH, left + width + (COLORBAR_PX if colorbar else MARGIN)))


def labelled_grid_size(n: int, h: int, w: int, cols: int | None = None) -> tuple[int, int]:
    """(height, width) of a grid of n h×w tiles with a LABEL_PX index strip above each row."""
    rows, _, height, width = grid_shape(n, h, w, cols)
    return height + rows * LABEL_PX, width


def grid_figure_size(n: int, h: int, w: int, cols: int | None, colorbar: bool) -> tuple[int, int]:
    """(height, width) of a framed grid of n h×w tiles (activations): each tile's index in a strip above
    it, or, for a filters-by-input grid (`cols` given), the output filter at the left of each row and
    the input channel above each column."""
    if cols is not None:
        _, _, height, width = grid_shape(n, h, w, cols)
        return figure_size(height, width, colorbar, left=ROW_LABEL_PX, top=LABEL_PX)
    height, width = labelled_grid_size(n, h, w, cols)
    return figure_size(height, width, colorbar)


def gradcam_size(h: int, w: int) -> tuple[int, int]:
    """(height, width) of the gradcam figure: three h×w panels (image | heatmap | overlay), their
    names above, the title above them and the heatmap's colour bar at the right."""
    return figure_size(h, 3 * w + 2 * PANEL_GAP, True, top=PANEL_LABEL_PX)


def grid_shape(n: int, h: int, w: int, cols: int | None = None, pad: int = PAD) -> tuple[int, int, int, int]:
    """(rows, cols, height, width) of a grid of n tiles of h×w; cols defaults to ceil(sqrt(n)).
    Size: rows*h + (rows-1)*pad by cols*w + (cols-1)*pad."""
    cols = min(cols or math.ceil(math.sqrt(n)), n)
    rows = math.ceil(n / cols)
    return rows, cols, rows * h + (rows - 1) * pad, cols * w + (cols - 1) * pad


def attention_size(heads: int) -> tuple[int, int]:
    """(height, width) in pixels of one attention layer's picture."""
    shown = min(heads, MAX_HEADS_DRAWN)
    return int(round(ATTENTION_INCHES * ATTENTION_DPI)), int(round((ATTENTION_HEAD_INCHES * shown + 0.8) * ATTENTION_DPI))


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
