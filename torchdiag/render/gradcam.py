"""Files of `gradcam`: original | heatmap | overlay side by side as one PNG (`--out FILE.png`)."""
from __future__ import annotations


def write_out(result, path) -> str:
    from .images import save_png

    return str(save_png(result.artefacts["panel"], path, "--out"))


def record(result, written: dict) -> None:
    """The CLI's render_extra: the file written, in the JSON document and first in the summary."""
    path = written.get("out")
    if path is None:
        return
    h, w = result.data["out_size"]
    result.data["out"] = path
    result.summary.insert(0, ("Picture", f"{path} (original | heatmap | overlay, {w}x{h} px)"))


# the files this command writes, by the kind its caller asks for (RenderSpec.outputs)
WRITERS = {"out": write_out}
