"""`torchdiag memory`: where the memory of a training step goes, measured or estimated."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from . import common as c

EXAMPLE = """Examples:

  torchdiag memory sample_models/cnn.py:build -i 32x3x32x32 --optimizer adam

  torchdiag memory sample_models/mlp.py:build -i 64x784 --batch-sizes 1,64,1024 --budget 512MiB --json

  torchdiag memory sample_models/llama.py:build --arg size="'7b'" -i 1x2048:int64 --device meta --dtype bfloat16 --shard 8 --budget 80GiB"""


def register(app) -> None:
    @app.command("memory", epilog=EXAMPLE, no_args_is_help=True)
    def memory(spec: c.Spec, arg: c.Args = None, input: c.Inputs = None, device: c.Device = "auto",
               mode: Annotated[str, typer.Option("--mode", help="train (forward, backward, optimizer step) or inference (forward, no grad).")] = "train",
               optimizer: Annotated[str, typer.Option("--optimizer", help="adam|adamw|sgd (sgd with momentum 0.9).")] = "adam",
               batch_sizes: Annotated[Optional[str], typer.Option("--batch-sizes", metavar="N,N,...", help="Estimate the peak for each batch size, e.g. 1,8,32.")] = None,
               budget: Annotated[Optional[str], typer.Option("--budget", metavar="SIZE", help="Memory per device, e.g. 24GiB, 512MB: the largest batch size that fits (estimated).")] = None,
               shard: Annotated[int, typer.Option("--shard", metavar="N", help="Per-device estimate with parameters/gradients/optimizer state sharded over N devices (ZeRO-1/2/3, FSDP).")] = 1,
               snapshot: Annotated[Optional[Path], typer.Option("--snapshot", metavar="FILE.pickle", help="CUDA only: record allocation history for PyTorch's memory viewer.")] = None,
               top: Annotated[int, typer.Option("--top", help="Modules shown, by activation memory (0 = all).")] = 10,
               depth: c.Depth = 3, loss: c.Loss = "auto", batch: c.Batch = None, seed: c.Seed = 0,
               json: c.Json = False, tb: c.Tb = None, debug: c.Debug = False, checkpoint: c.Checkpoint = None, strict_checkpoint: c.StrictCheckpoint = True, dtype: c.Dtype = None, amp: c.Amp = None, wrap: c.Wrap = "none") -> None:
        """Where the memory goes in a training step: parameters, gradients, optimizer state, activations
        (saved for backward), temporaries; the peak and when it happens; per-module activation memory.

        On cpu/cuda the step is measured on a copy of the model (tensor by tensor; on CUDA also the
        allocator's peak allocated/reserved). With --device meta, and for --batch-sizes and --budget,
        it is estimated on fake tensors: nothing is allocated, so a 7B model runs in seconds. Under
        --amp/--dtype the measured step also lists the input dtypes of every matmul/conv and the module
        it ran in; with --amp a matmul left in float32 is named (autocast-fallback)."""
        from ..diagnostics import memory as diag
        from ..render.memory import record
        from ..render.output import check_file

        opts = c.CommonOptions("memory", spec, arg or [], input or [], device, seed, json, tb, debug, loss, batch,
                               optimizer=dict(name=optimizer), outputs={"snapshot": snapshot}, checkpoint=checkpoint, strict_checkpoint=strict_checkpoint, dtype=dtype, amp=amp, wrap=wrap)

        c.execute(opts, diag, lambda: diag.Options(mode=mode, batch_sizes=batch_sizes or (), budget=budget, top=top,
                                                   depth=depth, shard=shard, snapshot=snapshot is not None),
                  render_extra=record, precheck=lambda: check_file(snapshot, "--snapshot"))
