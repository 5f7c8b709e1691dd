"""Files of `activations`: the feature-map and filter pictures (`--images DIR`)."""
from __future__ import annotations

from .images import record_pictures, write_pictures


def write_images(result, path) -> str:
    """<layer>_features.png and <layer>_filters.png in folder `path`; returns the folder."""
    return write_pictures(result, path, "--images")


def record(result, written: dict) -> None:
    """The CLI's render_extra: the paths written go into the JSON entries and the summary."""
    record_pictures(result, written.get("images"), at=0)


# the files this command writes, by the kind its caller asks for (RenderSpec.outputs)
WRITERS = {"images": write_images}
