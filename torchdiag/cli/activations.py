"""`torchdiag activations`: per-module output statistics; feature-map and filter pictures."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from . import common as c

EXAMPLE = """Examples:

  torchdiag activations sample_models/cnn.py:build -i 8x3x32x32

  torchdiag activations sample_models/cnn.py:build --layer features.0 --layer features.3 --images out/act

  torchdiag activations sample_models/mlp.py:build --tb runs --json"""

Layer = Annotated[list[str] | None, typer.Option("--layer", "-l", metavar="NAME", show_default=False,
                                                    help="Module path to picture (repeatable). Default with --images/--tb: every conv layer.")]
Images = Annotated[Path | None, typer.Option("--images", parser=c.nonempty_path, metavar="DIR", show_default=False,
                                                help="Write <layer>_features.png (feature maps of sample 0) and <layer>_filters.png (conv filters) into DIR.")]
Eps = Annotated[float, typer.Option("--eps", help="Saturation margin for bounded activations (Sigmoid, Tanh, ...), 0 to 0.5.")]


DETAILS = """With --layer/--images: a grid of the layer's feature maps and of its filters (first-layer
RGB filters in colour). With --tb: activation histograms of every module and the same images.
Exit 1 when an output holds NaN/Inf."""

OWN = {"layer": (Layer, None), "images": (Images, None), "eps": (Eps, 0.01)}


def run(o) -> None:
    from ..diagnostics import activations as diag
    from ..render.activations import record

    def precheck():   # before loading anything
        from ..render.images import check_pictures

        check_pictures(o.images, o.tb is not None, "activation pictures")

    job = c.job("activations", o, outputs={"images": o.images}, precheck=precheck,
                options=lambda: diag.Options(layers=o.layer or [], images=o.images is not None, tb=o.tb is not None,
                                             eps=o.eps))
    c.execute(job, render_extra=record)


def register(app) -> None:
    c.register(app, "activations", run, OWN, DETAILS, EXAMPLE)
