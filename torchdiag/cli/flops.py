"""`torchdiag flops`: FLOPs and MACs per module and per operator, forward and backward."""
from __future__ import annotations

from typing import Annotated

import typer

from . import common as c

EXAMPLE = """Examples:

  torchdiag flops sample_models/resnet.py:resnet50 -i 1x3x224x224 --device meta

  torchdiag flops sample_models/transformer_lm.py:build --backward --json

  torchdiag flops sample_models/cnn.py:build -i 1x3x32x32 --engine fvcore"""

DETAILS = """Counts are the same on cpu, cuda and meta (use --device meta for models too large to run).
Every op that ran without a FLOP formula is listed with its call count."""

OWN = {
    "depth": (c.Depth, 2),
    "backward": (Annotated[bool, typer.Option("--backward", help="Also run backward and count its FLOPs (measured, not 2× guessed).")], False),
    "engine": (Annotated[str, typer.Option("--engine", help="torch (dispatch-level, default) or fvcore (jit trace, for comparison).")], "torch"),
}


def run(o) -> None:
    from ..diagnostics import flops as diag

    # Options check engine/backward before anything loads (one check, for every caller)
    c.execute(c.job("flops", o, options=lambda: diag.Options(depth=o.depth, backward=o.backward, engine=o.engine)))


def register(app) -> None:
    c.register(app, "flops", run, OWN, DETAILS, EXAMPLE)
