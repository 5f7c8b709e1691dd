"""`torchdiag summary`: layers, output shapes, parameters (trainable, frozen, shared), sizes."""
from __future__ import annotations

from . import common as c

EXAMPLE = """Examples:

  torchdiag summary sample_models/cnn.py:build -i 8x3x32x32

  torchdiag summary sample_models/transformer_lm.py:build --depth 1 --json

  torchdiag summary sample_models/llama.py:build --arg size=7b --device meta"""


def register(app) -> None:
    @app.command("summary", epilog=EXAMPLE, no_args_is_help=True)
    def summary(spec: c.Spec, arg: c.Args = None, input: c.Inputs = None, device: c.Device = "auto",
                depth: c.Depth = 3, seed: c.Seed = 0, json: c.Json = False, tb: c.Tb = None,
                debug: c.Debug = False, checkpoint: c.Checkpoint = None, strict_checkpoint: c.StrictCheckpoint = True, dtype: c.Dtype = None, amp: c.Amp = None) -> None:
        """What is in this model: layers, output shapes, parameters (trainable, frozen, shared), sizes.

        One forward pass. Parameters shared by several modules are counted once and the tie is shown;
        modules that never ran are listed. Parameter counts per module come from torchinfo, totals are
        corrected for ties (torchinfo 1.8.0 counts them twice)."""
        from ..diagnostics import summary as diag

        opts = c.CommonOptions("summary", spec, arg or [], input or [], device, seed, json, tb, debug, checkpoint=checkpoint, strict_checkpoint=strict_checkpoint, dtype=dtype, amp=amp)
        # --tb: the graph is traced as data; render/tensorboard.py writes it with the other events
        c.execute(opts, diag, lambda: diag.Options(depth=depth, graph=tb is not None))
