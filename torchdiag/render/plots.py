"""What every `--plot` figure shares: the suffixes written, the check before any work, matplotlib's
off-screen backend, and the atomic save (render/output.py)."""
from __future__ import annotations

from ..pictures import need_pictures
from .output import atomic_path, check_file

PLOT_SUFFIXES = (".png", ".svg", ".pdf")   # the figure is written as its name's suffix says


def check_plot(path, option: str = "--plot") -> None:
    """Before any work: a writable file name with a suffix we write, and matplotlib installed."""
    if path is None:
        return
    check_file(path, option, PLOT_SUFFIXES)
    need_pictures(option, ("matplotlib",))


def pyplot():
    """matplotlib.pyplot on the off-screen Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def image_format(path) -> str:
    """The format a figure is saved in: the name's suffix; PNG for a name without one (/dev/null, a FIFO), whose
    temporary file's own suffix matplotlib would read (a review: "Format 'tmp' is not supported", exit 4)."""
    from pathlib import Path

    return Path(path).suffix.lstrip(".").lower() or "png"


def save(fig, path, option: str = "--plot") -> str:
    """The figure written atomically to `path`, then closed; returns the path."""
    plt = pyplot()
    try:
        with atomic_path(path, option) as tmp:
            fig.savefig(tmp, format=image_format(path))
    finally:
        plt.close(fig)
    return str(path)
