"""`torchdiag embeddings`: a layer's outputs for the batch, written for TensorBoard's projector."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from . import common as c

EXAMPLE = """Examples:

  torchdiag embeddings sample_models/cnn.py:build --layer head.0 --tb runs

  torchdiag embeddings sample_models/vit.py:build --layer ln --reduce first --batch data.py:batch --tb runs --json"""

Layer = Annotated[str, typer.Option("--layer", "-l", metavar="NAME", show_default=False,
                                    help="Module whose output is the embedding (one vector per sample).")]
Images = Annotated[Path | None, typer.Option("--images", parser=c.nonempty_path, metavar="DIR", show_default=False,
                                                help="Also write embeddings_<layer>_pca.png (samples on the first two principal components).")]
Reduce = Annotated[str, typer.Option("--reduce", help="auto|mean|first|flatten: how N×L×D or N×C×H×W outputs become one vector per sample.")]


DETAILS = """Labels come from --batch PATH:fn returning (inputs, labels); image inputs become the
projector's sprite. Reports the vector size and, with labels, how often a sample's
nearest neighbour shares its label."""

OWN = {"layer": (Layer, ""), "reduce": (Reduce, "auto"), "images": (Images, None)}


def run(o) -> None:
    from ..diagnostics import embeddings as diag
    from ..render.embeddings import record

    def precheck():  # before loading anything
        from ..render.images import check_pictures

        check_pictures(o.images, False, "the PCA preview")

    # tb: the result's tables/scalars (and an error) land in DIR/embeddings/ beside the projector data;
    # labels: the --batch target (ctx.batch_target)
    # without --tb the figures alone (the vectors' size, norms, nearest-neighbour labels: a new user wanted those
    # from --json, and was told to write TensorBoard files first)
    def options():
        return diag.Options(layer=o.layer, reduce=o.reduce, images=o.images is not None)

    job = c.job("embeddings", o, outputs={"projector": o.tb, "images": o.images}, precheck=precheck, options=options)
    c.execute(job, render_extra=record)


def register(app) -> None:
    c.register(app, "embeddings", run, OWN, DETAILS, EXAMPLE)
