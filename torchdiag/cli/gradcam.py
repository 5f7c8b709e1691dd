"""`torchdiag gradcam`: Grad-CAM heatmap of an image classifier for one image."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from . import common as c

EXAMPLE = """Examples:

  torchdiag gradcam sample_models/gradcam_region.py:build --layer features.0 --image docs/images/sample_input.png --out cam.png

  torchdiag gradcam sample_models/cnn.py:build --layer features.3 --image cat.jpg --size 32 --mean 0.49,0.48,0.45 --std 0.25,0.24,0.26 --target-class 3 --tb runs"""

Layer = Annotated[str, typer.Option("--layer", "-l", metavar="NAME", show_default=False,
                                    help="Module whose output is explained (usually the last conv layer).")]
Image = Annotated[Optional[Path], typer.Option("--image", metavar="FILE", show_default=False,
                                               help="Input image (PNG/JPEG), read as RGB (grayscale with --channels 1).")]
TargetClass = Annotated[Optional[int], typer.Option("--target-class", "-k", metavar="N", show_default=False,
                                                    help="Class to explain (default: the predicted class).")]
Out = Annotated[Optional[Path], typer.Option("--out", "-o", metavar="FILE.png", show_default=False,
                                             help="Write original | heatmap | overlay side by side as one PNG.")]
Size = Annotated[Optional[str], typer.Option("--size", metavar="H[xW]", show_default=False,
                                             help="Resize the image to H×W (one number: square). Default: the file's size.")]
Mean = Annotated[str, typer.Option("--mean", metavar="R,G,B", help="Normalisation mean (pixels scaled to [0,1] first); one number = every channel.")]
Std = Annotated[str, typer.Option("--std", metavar="R,G,B", help="Normalisation std; one number = every channel.")]
Channels = Annotated[int, typer.Option("--channels", metavar="3|1", help="3: RGB input; 1: grayscale input (e.g. MNIST), one --mean/--std.")]
Alpha = Annotated[float, typer.Option("--alpha", min=0.0, max=1.0, help="Heatmap opacity in the overlay.")]


def _triple(text: str, what: str, channels: int = 3):
    """One number per channel (one number is used for every channel)."""
    from ..errors import UsageError

    example = "0.485,0.456,0.406" if channels == 3 else "0.1307"
    try:
        vals = tuple(float(v) for v in text.replace(" ", "").split(","))
    except ValueError:
        raise UsageError(f"bad {what} '{text}'", hint=f"write {'three numbers' if channels == 3 else 'a number'}, "
                                                      f"e.g. {what} {example}") from None
    if len(vals) == 1:
        vals = vals * channels
    if len(vals) != channels:
        raise UsageError(f"bad {what} '{text}': need {channels} number{'s (R,G,B)' if channels == 3 else ' (grayscale)'}, "
                         f"got {len(vals)}", hint=f"e.g. {what} {example}")
    return vals


def _size(text):
    from ..errors import UsageError

    if text is None:
        return None
    parts = text.lower().split("x")
    try:
        dims = [int(p) for p in parts]
    except ValueError:
        raise UsageError(f"bad --size '{text}'", hint="write H or HxW, e.g. --size 224 or --size 32x48") from None
    if len(dims) == 1:
        dims = dims * 2
    if len(dims) != 2 or min(dims) < 1:
        raise UsageError(f"bad --size '{text}'", hint="write H or HxW with positive integers")
    return tuple(dims)


def register(app) -> None:
    @app.command("gradcam", epilog=EXAMPLE, no_args_is_help=True)
    def gradcam(spec: c.Spec, layer: Layer = "", image: Image = None, target_class: TargetClass = None,
                out: Out = None, size: Size = None, mean: Mean = "0", std: Std = "1", channels: Channels = 3,
                alpha: Alpha = 0.5,
                arg: c.Args = None, device: c.Device = "auto", seed: c.Seed = 0, json: c.Json = False,
                tb: c.Tb = None, debug: c.Debug = False) -> None:
        """Grad-CAM: which part of the image drives a classifier's score for a class.

        The image is read as RGB (--channels 1: grayscale), resized (--size), scaled to [0,1] and
        normalised ((x - mean)/std).
        Writes the original, the heatmap (values in [0,1]) and the overlay side by side (--out) and
        to TensorBoard (--tb). Reports the explained class, the top classes and where the map peaks."""
        opts = c.CommonOptions("gradcam", spec, arg or [], [], device, seed, json, tb, debug, needs_inputs=False)
        parsed = {}

        def need_image():  # before loading anything
            from ..errors import UsageError

            if image is None:
                raise UsageError("gradcam needs an image: --image FILE",
                                 hint="a PNG or JPEG; use --size/--mean/--std/--channels to match the model's preprocessing")
            if channels not in (1, 3):
                raise UsageError(f"--channels {channels}: an image has 3 (RGB) or 1 (grayscale) channels")
            parsed.update(size=_size(size), mean=_triple(mean, "--mean", channels), std=_triple(std, "--std", channels))
            if any(v == 0 for v in parsed["std"]):
                raise UsageError(f"--std {std}: a standard deviation of 0 divides by zero")
            c.output_file(out, "--out", (".png",))   # only PNG is written

        def run(t):
            from ..diagnostics import gradcam as diag
            from ..render.images import need_pictures

            need_pictures("Grad-CAM pictures")
            return diag.run(t.model, t.device, diag.Options(
                layer=layer, image=str(image), size=parsed["size"], mean=parsed["mean"], std=parsed["std"],
                channels=channels, target_class=target_class, out=str(out) if out else None,
                tb=tb is not None, alpha=alpha))

        c.execute(opts, run, precheck=need_image)
