"""Pictures of `gradcam`: original | heatmap | overlay, drawn from the image and the heatmap the
diagnostic returns (result.artefacts), for TensorBoard and as one PNG (`--out FILE.png`)."""
from __future__ import annotations


def draw(result) -> None:
    """The three panels, enlarged by data["picture_scale"]: result.images (tb) and artefacts["panel"] (out)."""
    from . import images as im

    a = result.artefacts
    if "image" not in a:    # no pictures were asked for
        return
    rgb, hm, f = a["image"], a["heatmap"], result.data["picture_scale"]
    original = im.upscale(rgb, f)
    heat_rgb = im.upscale(im.colorize(hm, "jet"), f)
    blended = im.upscale(im.overlay(rgb, hm, a["alpha"]), f)
    if a.get("tb"):
        result.images.update({"gradcam/original": original, "gradcam/heatmap": heat_rgb, "gradcam/overlay": blended})
    if a.get("out"):
        a["panel"] = im.hstack([original, heat_rgb, blended])


def write_out(result, path) -> str:
    from .images import drawn, save_png

    drawn(result)
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
