"""`torchdiag gradcam`: Grad-CAM heatmap of an image classifier for one image."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from . import common as c

EXAMPLE = """Examples:

  torchdiag gradcam sample_models/gradcam_region.py:build --layer features.0 --image docs/images/sample_input.png --out cam.png

  torchdiag gradcam sample_models/cnn.py:build --layer features.3 --image cat.jpg --size 32 --mean 0.49,0.48,0.45 --std 0.25,0.24,0.26 --target-class 3 --tb runs"""

Layer = Annotated[str, typer.Option("--layer", "-l", metavar="NAME", show_default=False,
                                    help="Module whose output is explained (usually the last conv layer).")]
Image = Annotated[Path | None, typer.Option("--image", parser=c.nonempty_path, metavar="FILE", show_default=False,
                                               help="Input image (PNG/JPEG), read as RGB (grayscale with --channels 1).")]
TargetClass = Annotated[int | None, typer.Option("--target-class", "-k", metavar="N", show_default=False,
                                                    help="Class to explain (default: the predicted class).")]
Out = Annotated[Path | None, typer.Option("--out", "-o", parser=c.nonempty_path, metavar="FILE.png", show_default=False,
                                             help="Write original | heatmap | overlay side by side as one PNG.")]
Size = Annotated[str | None, typer.Option("--size", metavar="H[xW]", show_default=False,
                                             help="Resize the image to H×W (one number: square). Default: the size of the model's own image input (timm's pretrained_cfg, an hf: config, example_inputs()), else the file's.")]
Mean = Annotated[str | None, typer.Option("--mean", metavar="R,G,B", show_default=False, help="Normalisation mean (pixels scaled to [0,1] first); one number = every channel. Default: the model's own (a torchvision or timm spec's weights preprocessing), else 0.")]
Std = Annotated[str | None, typer.Option("--std", metavar="R,G,B", show_default=False, help="Normalisation std; one number = every channel. Default: the model's own, else 1.")]
Channels = Annotated[int, typer.Option("--channels", metavar="3|1", help="3: RGB input; 1: grayscale input (e.g. MNIST), one --mean/--std.")]
Alpha = Annotated[float, typer.Option("--alpha", help="Heatmap opacity in the overlay, 0 to 1.")]


DETAILS = """The image is read as RGB (--channels 1: grayscale), resized (--size), scaled to [0,1] and
normalised ((x - mean)/std).
Writes the original, the heatmap (values in [0,1]) and the overlay side by side (--out) and
to TensorBoard (--tb). Reports the explained class, the top classes and where the map peaks."""

OWN = {"layer": (Layer, ""), "image": (Image, None), "target_class": (TargetClass, None), "out": (Out, None),
       "size": (Size, None), "mean": (Mean, None), "std": (Std, None), "channels": (Channels, 3), "alpha": (Alpha, 0.5)}


def run(o) -> None:
    from ..diagnostics import gradcam as diag
    from ..render.gradcam import record

    def precheck():  # before loading anything; the image and pictures libraries are checked by diag.Options
        c.output_file(o.out, "--out", (".png",))   # only PNG is written

    job = c.job("gradcam", o, needs_inputs=False, outputs={"out": o.out}, precheck=precheck, options=lambda: diag.Options(
        layer=o.layer, image=str(o.image) if o.image is not None else "", size=o.size, mean=o.mean, std=o.std,
        channels=o.channels, target_class=o.target_class, out=o.out is not None, tb=o.tb is not None, alpha=o.alpha))
    c.execute(job, render_extra=record)


def register(app) -> None:
    c.register(app, "gradcam", run, OWN, DETAILS, EXAMPLE)
