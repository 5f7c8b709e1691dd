"""Pictures of `gradcam`: original | heatmap | overlay, drawn from the image and the heatmap the
diagnostic returns (result.artefacts), for TensorBoard and as one PNG (`--out FILE.png`).

The PNG (and TensorBoard's gradcam/figure) is one labelled figure: a title naming the command, the
layer and the class explained (index, and name when the model gives one), the model and the score
below it, the three panels enlarged (nearest) with their names above them, and the heatmap's colour
bar (relative importance, max = 1). TensorBoard also gets the three panels alone (gradcam/original,
gradcam/heatmap, gradcam/overlay)."""
from __future__ import annotations

PANELS = ("original", "Grad-CAM heatmap", "overlay")


def class_text(data) -> str:
    """`class 3` or `class 3 (cat)`."""
    name = data.get("class_name")
    return f"class {data['target_class']}" + (f" ({name})" if name else "")


def figure(result, original, heat_rgb, blended):
    """The three panels in one labelled figure: (HxWx3 uint8, PNG text)."""
    from ..pictures import PANEL_GAP, PANEL_LABEL_PX
    from . import images as im

    d, layer = result.data, result.header.get("layer", "")
    h, w = original.shape[:2]
    title = f"gradcam · layer {layer} · {class_text(d)}"
    chosen = "top class" if d.get("target_chosen") == "argmax" else "class asked for"
    subtitle = (f"{im.model_name(result)} · {chosen}, logit {d['score']:.4g}, p={d['probability']:.3f} · "
                f"image {str(result.header.get('image_size', '')).split(' (')[0]}, drawn ×{d['picture_scale']}")
    panels = im.hstack([original, heat_rgb, blended], pad=PANEL_GAP)
    names = [*PANELS[:2], f"{PANELS[2]} (alpha {result.artefacts['alpha']:g})"]
    texts = [(i * (w + PANEL_GAP), -3, name, {"fontsize": 8, "va": "bottom", "ha": "left", "color": "#111111"})
             for i, name in enumerate(names)]
    bar = {"cmap": "jet", "vmin": 0.0, "vmax": 1.0, "label": "relative importance (max = 1)"}
    img = im.framed(panels, title, subtitle, bar, top=PANEL_LABEL_PX, texts=texts)
    text = im.png_text(result, layer, title, f"{subtitle}; panels: {' | '.join(names)}",
                       class_index=d["target_class"], **({"class_name": d["class_name"]} if d.get("class_name") else {}))
    return img, text


def draw(result) -> None:
    """The panels, enlarged by data["picture_scale"]: result.images (tb) and artefacts["panel"] (out)."""
    from . import images as im

    a = result.artefacts
    if "image" not in a:    # no pictures were asked for
        return
    rgb, hm, f = a["image"], a["heatmap"], result.data["picture_scale"]
    original = im.upscale(rgb, f)
    heat_rgb = im.upscale(im.colorize(hm, "jet"), f)
    blended = im.upscale(im.overlay(rgb, hm, a["alpha"]), f)
    img, text = figure(result, original, heat_rgb, blended)
    if a.get("tb"):
        result.images.update({"gradcam/original": original, "gradcam/heatmap": heat_rgb, "gradcam/overlay": blended,
                              "gradcam/figure": img})
    if a.get("out"):
        a["panel"], a["panel_text"] = img, text


def write_out(result, path) -> str:
    from .images import drawn, save_png

    drawn(result)
    return str(save_png(result.artefacts["panel"], path, "--out", result.artefacts.get("panel_text")))


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
