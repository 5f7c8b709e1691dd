"""`torchdiag activations`: per-module output statistics; feature-map and filter pictures."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from . import common as c

EXAMPLE = """Examples:

  torchdiag activations sample_models/cnn.py:build -i 8x3x32x32

  torchdiag activations sample_models/cnn.py:build --layer features.0 --layer features.3 --images out/act

  torchdiag activations sample_models/mlp.py:build --tb runs --json"""

Layer = Annotated[Optional[list[str]], typer.Option("--layer", "-l", metavar="NAME", show_default=False,
                                                    help="Module path to picture (repeatable). Default with --images/--tb: every conv layer.")]
Images = Annotated[Optional[Path], typer.Option("--images", metavar="DIR", show_default=False,
                                                help="Write <layer>_features.png (feature maps of sample 0) and <layer>_filters.png (conv filters) into DIR.")]
Eps = Annotated[float, typer.Option("--eps", help="Saturation margin for bounded activations (Sigmoid, Tanh, ...), 0 to 0.5.")]


def register(app) -> None:
    @app.command("activations", epilog=EXAMPLE, no_args_is_help=True)
    def activations(spec: c.Spec, layer: Layer = None, images: Images = None, eps: Eps = 0.01,
                    arg: c.Args = None, input: c.Inputs = None, device: c.Device = "auto", seed: c.Seed = 0,
                    json: c.Json = False, tb: c.Tb = None, debug: c.Debug = False, checkpoint: c.Checkpoint = None, strict_checkpoint: c.StrictCheckpoint = True, dtype: c.Dtype = None, amp: c.Amp = None) -> None:
        """What each module produces: output shape, mean, std, min, max, fraction of zeros and of
        saturated values, for one forward pass (eval mode, no grad).

        With --layer/--images: a grid of the layer's feature maps and of its filters (first-layer
        RGB filters in colour). With --tb: activation histograms of every module and the same images.
        Exit 1 when an output holds NaN/Inf."""
        from ..diagnostics import activations as diag
        from ..render.activations import record

        opts = c.CommonOptions("activations", spec, arg or [], input or [], device, seed, json, tb, debug,
                               outputs={"images": images}, checkpoint=checkpoint, strict_checkpoint=strict_checkpoint, dtype=dtype, amp=amp)

        def precheck():   # before loading anything
            from ..render.images import check_pictures

            check_pictures(images, tb is not None, "activation pictures")

        c.execute(opts, diag, lambda: diag.Options(layers=layer or [], images=images is not None, tb=tb is not None,
                                                   eps=eps), render_extra=record, precheck=precheck)
