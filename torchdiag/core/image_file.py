"""Reading the image file a diagnostic explains (gradcam): its size from the header first, then its
pixels as a uint8 array, through Pillow (the plot extra)."""
from __future__ import annotations

from pathlib import Path

from ..errors import UsageError

DECODE_BYTES_PER_PIXEL = 12   # decoding a file: PIL's image, its RGB conversion and the numpy copy


def _open(path):
    """PIL's lazy open (reads the header only), with its decompression-bomb guard as an error."""
    import warnings

    from PIL import Image, UnidentifiedImageError

    p = Path(path)
    if p.is_dir():
        raise UsageError(f"--image {path} is a directory, not an image file", hint="give one PNG/JPEG file with --image")
    if not p.is_file():
        if p.exists():   # a device, FIFO or socket: said as what it is, never opened (a sweep: "not found")
            from .limits import regular_file

            regular_file(str(path), "--image", hint="give one PNG/JPEG file with --image")
        raise UsageError(f"image file not found: {path}", hint="give an existing PNG/JPEG file with --image")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            return Image.open(p)
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise UsageError(f"image too large: {path}: {exc}", hint="give a smaller image (resize it first)") from None
    except (UnidentifiedImageError, OSError) as exc:
        raise UsageError(f"cannot read image {path}: {exc}", hint="give a PNG or JPEG file") from None


def image_size(path, limit_bytes: int | None = None) -> tuple[int, int]:
    """(height, width) from the file's header, before any pixel is decoded. With `limit_bytes`,
    a file whose decoding would take more is "image too large" (exit 2): a 30000×30000 PNG of a
    few kilobytes would otherwise take gigabytes."""
    with _open(path) as im:
        w, h = im.size
    if limit_bytes is not None and w * h * DECODE_BYTES_PER_PIXEL > limit_bytes:
        raise UsageError(f"image too large: {path} is {w}×{h} pixels ({w * h * DECODE_BYTES_PER_PIXEL / 2**30:.1f} GiB "
                         f"to decode, more than the {limit_bytes / 2**30:.1f} GiB allowed)",
                         hint="give a smaller image (resize it first)")
    return h, w


def load_rgb(path, size: tuple[int, int] | None = None, channels: int = 3):
    """Read an image file as HxWx3 uint8 RGB (channels=1: HxWx1 grayscale, PIL's "L"), resized
    (bilinear) to size=(h, w) when given. Callers check image_size() first when the file is not theirs."""
    import numpy as np
    from PIL import Image

    im = _open(path)
    try:
        with im:
            im = im.convert("L" if channels == 1 else "RGB")
            if size is not None and (im.height, im.width) != tuple(size):
                im = im.resize((size[1], size[0]), Image.BILINEAR)
            arr = np.asarray(im, dtype=np.uint8).copy()
            return arr[..., None] if arr.ndim == 2 else arr
    except (Image.DecompressionBombError, OSError) as exc:
        raise UsageError(f"cannot read image {path}: {exc}", hint="give a PNG or JPEG file") from None
