"""`torchdiag memory`: where the memory of a training step goes, measured or estimated."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from . import common as c

EXAMPLE = """Examples:

  torchdiag memory sample_models/cnn.py:build -i 32x3x32x32 --optimizer adam

  torchdiag memory sample_models/mlp.py:build -i 64x784 --batch-sizes 1,64,1024 --budget 512MiB --json

  torchdiag memory sample_models/llama.py:build --arg size="'7b'" -i 1x2048:int64 --device meta --dtype bfloat16 --shard 8 --budget 80GiB"""

DETAILS = """On cpu/cuda the step is measured on a copy of the model (tensor by tensor; on CUDA also the
allocator's peak allocated/reserved). With --device meta, and for --batch-sizes and --budget,
it is estimated on fake tensors: nothing is allocated, so a 7B model runs in seconds. Under
--amp/--dtype the measured step also lists the input dtypes of every matmul/conv and the module
it ran in; with --amp a matmul left in float32 is named (autocast-fallback)."""

OWN = {
    "mode": (Annotated[str, typer.Option("--mode", help="train (forward, backward, optimizer step) or inference (forward, no grad).")], "train"),
    "optimizer": (Annotated[str | None, typer.Option("--optimizer", show_default=False, help="adam|adamw|sgd (sgd with momentum 0.9), with --mode train. Default: adam.")], None),
    "batch_sizes": (Annotated[str | None, typer.Option("--batch-sizes", metavar="N,N,...", help="Estimate the peak for each batch size, e.g. 1,8,32.")], None),
    "budget": (Annotated[str | None, typer.Option("--budget", metavar="SIZE", help="Memory per device, e.g. 24GiB, 512MB: the largest batch size that fits (estimated).")], None),
    "shard": (Annotated[int, typer.Option("--shard", metavar="N", help="Per-device estimate with parameters/gradients/optimizer state sharded over N devices (ZeRO-1/2/3, FSDP).")], 1),
    "snapshot": (Annotated[Path | None, typer.Option("--snapshot", parser=c.nonempty_path, metavar="FILE.pickle", help="CUDA only: record allocation history for PyTorch's memory viewer.")], None),
    "top": (Annotated[int, typer.Option("--top", help="Modules shown, by activation memory (0 = all).")], 10),
    "depth": (c.Depth, 3),
}


def run(o) -> None:
    from ..diagnostics import memory as diag
    from ..render.memory import record
    from ..render.output import check_file

    def precheck():
        if o.optimizer is not None and o.mode == "inference":   # a review: taken and ignored without a word
            from ..errors import UsageError

            raise UsageError("--optimizer applies to --mode train: an inference step has no optimizer",
                             hint="leave --optimizer out, or use --mode train")
        check_file(o.snapshot, "--snapshot")

    job = c.job("memory", o, optimizer=dict(name=o.optimizer or "adam"), outputs={"snapshot": o.snapshot},
                precheck=precheck,
                options=lambda: diag.Options(mode=o.mode, batch_sizes=o.batch_sizes if o.batch_sizes is not None else (), budget=o.budget, top=o.top,
                                             depth=o.depth, shard=o.shard, snapshot=o.snapshot is not None))
    c.execute(job, render_extra=record)


def register(app) -> None:
    c.register(app, "memory", run, OWN, DETAILS, EXAMPLE)
