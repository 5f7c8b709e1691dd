"""`torchdiag embeddings`: a layer's outputs for the batch, written for TensorBoard's projector."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from . import common as c

EXAMPLE = """Examples:

  torchdiag embeddings sample_models/cnn.py:build --layer head.0 --tb runs

  torchdiag embeddings sample_models/vit.py:build --layer ln --reduce first --batch data.py:batch --tb runs --json"""

Layer = Annotated[str, typer.Option("--layer", "-l", metavar="NAME", show_default=False,
                                    help="Module whose output is the embedding (one vector per sample).")]
Images = Annotated[Optional[Path], typer.Option("--images", metavar="DIR", show_default=False,
                                                help="Also write embeddings_<layer>_pca.png (samples on the first two principal components).")]
Reduce = Annotated[str, typer.Option("--reduce", help="auto|mean|first|flatten: how N×L×D or N×C×H×W outputs become one vector per sample.")]


def register(app) -> None:
    @app.command("embeddings", epilog=EXAMPLE, no_args_is_help=True)
    def embeddings(spec: c.Spec, layer: Layer = "", reduce: Reduce = "auto", images: Images = None, arg: c.Args = None, input: c.Inputs = None,
                   batch: c.Batch = None, device: c.Device = "auto", seed: c.Seed = 0, json: c.Json = False,
                   tb: c.Tb = None, debug: c.Debug = False, checkpoint: c.Checkpoint = None, strict_checkpoint: c.StrictCheckpoint = True) -> None:
        """Write the layer's outputs for the batch for TensorBoard's projector (DIR/embeddings/).

        Labels come from --batch PATH:fn returning (inputs, labels); image inputs become the
        projector's sprite. Reports the vector size and, with labels, how often a sample's
        nearest neighbour shares its label."""
        from ..diagnostics import embeddings as diag
        from ..render.embeddings import record

        # tb in opts: the result's tables/scalars (and an error) land in DIR/embeddings/ beside the projector data
        opts = c.CommonOptions("embeddings", spec, arg or [], input or [], device, seed, json, tb, debug, batch=batch,
                               outputs={"projector": tb, "images": images}, checkpoint=checkpoint, strict_checkpoint=strict_checkpoint)

        def precheck():  # before loading anything
            from ..errors import UsageError

            if tb is None:
                raise UsageError("embeddings needs --tb DIR: the projector data is written for TensorBoard",
                                 hint="e.g. --tb runs, then tensorboard --logdir runs (PROJECTOR tab)")
            from ..render.images import check_pictures

            check_pictures(images, False, "the PCA preview")

        # labels: the --batch target (ctx.batch_target)
        c.execute(opts, diag, lambda: diag.Options(layer=layer, reduce=reduce, images=images is not None),
                  render_extra=record, precheck=precheck)
