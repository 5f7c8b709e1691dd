"""`torchdiag summary`: layers, output shapes, parameters (trainable, frozen, shared), sizes."""
from __future__ import annotations

from . import common as c

EXAMPLE = """Examples:

  torchdiag summary sample_models/cnn.py:build -i 8x3x32x32

  torchdiag summary sample_models/transformer_lm.py:build --depth 1 --json

  torchdiag summary sample_models/llama.py:build --arg size=7b --device meta"""

DETAILS = """One forward pass. Parameters shared by several modules are counted once and the tie is shown;
modules that never ran are listed. Parameter counts per module come from torchinfo, totals are
corrected for ties (torchinfo 1.8.0 counts them twice)."""

OWN = {"depth": (c.Depth, 3)}


def run(o) -> None:
    from ..diagnostics import summary as diag

    # --tb: the graph is traced as data; render/tensorboard.py writes it with the other events
    c.execute(c.job("summary", o, options=lambda: diag.Options(depth=o.depth, graph=o.tb is not None)))


def register(app) -> None:
    c.register(app, "summary", run, OWN, DETAILS, EXAMPLE)
