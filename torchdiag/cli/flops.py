"""`torchdiag flops`: FLOPs and MACs per module and per operator, forward and backward."""
from __future__ import annotations

from typing import Annotated

import typer

from . import common as c

EXAMPLE = """Examples:

  torchdiag flops sample_models/resnet.py:resnet50 -i 1x3x224x224 --device meta

  torchdiag flops sample_models/transformer_lm.py:build --backward --json

  torchdiag flops sample_models/cnn.py:build -i 1x3x32x32 --engine fvcore"""


def register(app) -> None:
    @app.command("flops", epilog=EXAMPLE, no_args_is_help=True)
    def flops(spec: c.Spec, arg: c.Args = None, input: c.Inputs = None, device: c.Device = "auto",
              depth: c.Depth = 2,
              backward: Annotated[bool, typer.Option("--backward", help="Also run backward and count its FLOPs (measured, not 2× guessed).")] = False,
              engine: Annotated[str, typer.Option("--engine", help="torch (dispatch-level, default) or fvcore (jit trace, for comparison).")] = "torch",
              loss: c.Loss = "auto", batch: c.Batch = None,
              seed: c.Seed = 0, json: c.Json = False, tb: c.Tb = None, debug: c.Debug = False, checkpoint: c.Checkpoint = None, strict_checkpoint: c.StrictCheckpoint = True, dtype: c.Dtype = None, amp: c.Amp = None) -> None:
        """How much compute: FLOPs and MACs per module and per operator (1 MAC = 2 FLOPs).

        Counts are the same on cpu, cuda and meta (use --device meta for models too large to run).
        Every op that ran without a FLOP formula is listed with its call count."""
        from ..diagnostics import flops as diag

        opts = c.CommonOptions("flops", spec, arg or [], input or [], device, seed, json, tb, debug, loss, batch, checkpoint=checkpoint, strict_checkpoint=strict_checkpoint, dtype=dtype, amp=amp)
        # Options check engine/backward before anything loads (one check, for every caller)
        c.execute(opts, diag, lambda: diag.Options(depth=depth, backward=backward, engine=engine))
