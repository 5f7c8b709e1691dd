"""Pictures of `activations`: the feature maps and filters the diagnostic describes
(result.artefacts["drawings"]), drawn for TensorBoard and as PNG files (`--images DIR`)."""
from __future__ import annotations

from . import images as im
from .images import record_pictures, write_pictures


def _tile(kind: str, plane):
    """One plane as an HxWx3 uint8 tile: a feature map min-max scaled through the colour map; filter
    values (already in [0, 1]) in colour or gray."""
    if kind == "feature_maps":
        return im.colorize(im.normalize01(plane))
    return im.to_rgb_uint8(plane) if kind == "rgb" else im.gray(plane)


def draw(result) -> None:
    """Each described picture as a grid: into result.images (tb) and artefacts["pictures"] (images)."""
    a = result.artefacts
    for d in a.get("drawings", []):
        grid = im.tile([im.upscale(_tile(d["kind"], p), d["scale"]) for p in d["planes"]], d["cols"])
        tag = "feature_maps" if d["kind"] == "feature_maps" else "filters"
        if a.get("tb"):
            result.images[f"activations/{d['layer']}/{tag}"] = grid
        if a.get("images"):
            a.setdefault("pictures", []).append((f"{im.safe_name(d['layer'])}_{d['suffix']}.png", grid))


def write_images(result, path) -> str:
    """<layer>_features.png and <layer>_filters.png in folder `path`; returns the folder."""
    im.drawn(result)
    return write_pictures(result, path, "--images")


def record(result, written: dict) -> None:
    """The CLI's render_extra: the paths written go into the JSON entries and the summary."""
    record_pictures(result, written.get("images"), at=0)


# the files this command writes, by the kind its caller asks for (RenderSpec.outputs)
WRITERS = {"images": write_images}
