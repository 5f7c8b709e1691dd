"""`torchdiag profile`: where the time goes — step times, top operators, per-module rollup, traces."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from . import common as c

EXAMPLE = """Examples:

  torchdiag profile sample_models/cnn.py:build -i 8x3x32x32

  torchdiag profile model.py:build --device cuda --mode train --trace run.json

  torchdiag profile sample_models/mlp.py:build --record-shapes --memory --top 10 --json

  torchdiag profile sample_models/resnet.py:build --mode train --tb runs/

  torchdiag profile sample_models/syncs.py:build --syncs --mode train

Exit codes: 0 profiled · 2 usage (bad option or input, --device cuda without a GPU, missing --trace directory) · 3 the model raised (forward, loss, backward, optimizer step) · 4 internal torchdiag error."""

Mode = Annotated[str | None, typer.Option("--mode", show_default=False, help="inference (eval, no grad) | train (forward + loss + backward + optimizer step, on a copy). Default: inference; under torchrun with --wrap ddp|fsdp, train (DDP communicates only in backward).")]
Wait = Annotated[int, typer.Option("--wait", help="Steps run before profiling starts (not recorded).")]
Warmup = Annotated[int, typer.Option("--warmup", help="Steps profiled and thrown away (profiler warm-up).")]
Active = Annotated[int, typer.Option("--active", help="Steps recorded: statistics, tables and trace come from these.")]
Top = Annotated[int, typer.Option("--top", "-k", help="Operators listed, by self time (0 = all).")]
Shapes = Annotated[bool, typer.Option("--record-shapes", help="Split operators by input shapes (adds an input-shapes column).")]
Memory = Annotated[bool, typer.Option("--memory", help="Record allocations: memory columns for operators and modules.")]
Trace = Annotated[Path | None, typer.Option("--trace", parser=c.nonempty_path, metavar="FILE.json", help="Write a Chrome/Perfetto trace (open in ui.perfetto.dev or chrome://tracing).")]
Syncs = Annotated[bool, typer.Option("--syncs", help="Also run one step with host-sync detection and list each line of your code that made the host wait for the device (.item(), if tensor:, .cpu(), nonzero, boolean-mask indexing, print(tensor)), with counts per step.")]
Optim = Annotated[str, typer.Option("--optimizer", help="Train mode optimizer: adam | adamw | sgd (lr 1e-3).")]


DETAILS = """torch.profiler runs with a schedule: --wait steps, then --warmup steps, then --active steps
recorded. On CUDA, CUDA activity is recorded too and each step ends with a synchronisation.
--tb DIR writes the trace under DIR/profile/ (tensorboard_trace_handler) with the step-time
scalars. Train mode works on a copy: the model's parameters are never changed.
--syncs runs one more step under host-sync detection (dispatch level; on CUDA also
torch.cuda.set_sync_debug_mode) and lists each place in your code that forced a sync.
Under --amp/--dtype one more step lists the input dtypes of every matmul/conv and the module it
ran in; with --amp a matmul left in float32 is named (autocast-fallback)."""

OWN = {"mode": (Mode, None), "wait": (Wait, 1), "warmup": (Warmup, 2), "active": (Active, 5), "top": (Top, 15),
       "record_shapes": (Shapes, False), "memory": (Memory, False), "trace": (Trace, None), "syncs": (Syncs, False),
       "optimizer": (Optim, "adam"), "depth": (c.Depth, 3)}


def run(o) -> None:
    from ..diagnostics import profile as diag
    from ..render.profile import record

    job = c.job("profile", o, optimizer=dict(name=o.optimizer), outputs={"trace": o.trace, "tb_trace": o.tb},
                precheck=lambda: _check_trace(o.trace), options=lambda: diag.Options(
                    mode=o.mode, wait=o.wait, warmup=o.warmup, active=o.active, top=o.top, record_shapes=o.record_shapes,
                    memory=o.memory, trace=o.trace is not None or o.tb is not None, depth=o.depth, syncs=o.syncs))
    c.execute(job, render_extra=record)


def register(app) -> None:
    c.register(app, "profile", run, OWN, DETAILS, EXAMPLE)


def _check_trace(path) -> None:
    """FILE.json or FILE.json.gz (gzipped, as torch.profiler does), nothing else: a sweep's --trace model.py replaced
    the file with a trace."""
    from ..render.output import check_file

    gz = path is not None and str(path).lower().endswith(".json.gz")
    check_file(path, "--trace", (".gz",) if gz else (".json", ".json.gz"))
