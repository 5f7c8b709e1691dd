"""`torchdiag profile`: where the time goes — step times, top operators, per-module rollup, traces."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from . import common as c

EXAMPLE = """Examples:

  torchdiag profile sample_models/cnn.py:build -i 8x3x32x32

  torchdiag profile model.py:build --device cuda --mode train --trace run.json

  torchdiag profile sample_models/mlp.py:build --record-shapes --memory --top 10 --json

  torchdiag profile sample_models/resnet.py:build --mode train --tb runs/

  torchdiag profile sample_models/syncs.py:build --syncs --mode train

Exit codes: 0 profiled · 2 usage (bad option or input, --device cuda without a GPU, missing --trace directory) · 3 the model raised (forward, loss, backward, optimizer step) · 4 internal torchdiag error."""

Mode = Annotated[Optional[str], typer.Option("--mode", show_default=False, help="inference (eval, no grad) | train (forward + loss + backward + optimizer step, on a copy). Default: inference; under torchrun with --wrap ddp|fsdp, train (DDP communicates only in backward).")]
Wait = Annotated[int, typer.Option("--wait", help="Steps run before profiling starts (not recorded).")]
Warmup = Annotated[int, typer.Option("--warmup", help="Steps profiled and thrown away (profiler warm-up).")]
Active = Annotated[int, typer.Option("--active", help="Steps recorded: statistics, tables and trace come from these.")]
Top = Annotated[int, typer.Option("--top", "-k", help="Operators listed, by self time (0 = all).")]
Shapes = Annotated[bool, typer.Option("--record-shapes", help="Split operators by input shapes (adds an input-shapes column).")]
Memory = Annotated[bool, typer.Option("--memory", help="Record allocations: memory columns for operators and modules.")]
Trace = Annotated[Optional[Path], typer.Option("--trace", metavar="FILE.json", help="Write a Chrome/Perfetto trace (open in ui.perfetto.dev or chrome://tracing).")]
Syncs = Annotated[bool, typer.Option("--syncs", help="Also run one step with host-sync detection and list each line of your code that made the host wait for the device (.item(), if tensor:, .cpu(), nonzero, boolean-mask indexing, print(tensor)), with counts per step.")]
Optim = Annotated[str, typer.Option("--optimizer", help="Train mode optimizer: adam | adamw | sgd (lr 1e-3).")]


def register(app) -> None:
    @app.command("profile", epilog=EXAMPLE, no_args_is_help=True)
    def profile(spec: c.Spec, arg: c.Args = None, input: c.Inputs = None, device: c.Device = "auto",
                mode: Mode = None, wait: Wait = 1, warmup: Warmup = 2, active: Active = 5,
                top: Top = 15, record_shapes: Shapes = False, memory: Memory = False, trace: Trace = None,
                syncs: Syncs = False, optimizer: Optim = "adam", loss: c.Loss = "auto", batch: c.Batch = None, depth: c.Depth = 3,
                seed: c.Seed = 0, json: c.Json = False, tb: c.Tb = None, debug: c.Debug = False, checkpoint: c.Checkpoint = None, strict_checkpoint: c.StrictCheckpoint = True, dtype: c.Dtype = None, amp: c.Amp = None, wrap: c.Wrap = "none") -> None:
        """Where the time goes: step time (mean, median, p90), throughput, top operators by self time,
        time per module, and a Chrome/Perfetto trace.

        torch.profiler runs with a schedule: --wait steps, then --warmup steps, then --active steps
        recorded. On CUDA, CUDA activity is recorded too and each step ends with a synchronisation.
        --tb DIR writes the trace under DIR/profile/ (tensorboard_trace_handler) with the step-time
        scalars. Train mode works on a copy: the model's parameters are never changed.
        --syncs runs one more step under host-sync detection (dispatch level; on CUDA also
        torch.cuda.set_sync_debug_mode) and lists each place in your code that forced a sync.
        Under --amp/--dtype one more step lists the input dtypes of every matmul/conv and the module it
        ran in; with --amp a matmul left in float32 is named (autocast-fallback)."""
        from ..diagnostics import profile as diag
        from ..render.output import check_file
        from ..render.profile import record

        opts = c.CommonOptions("profile", spec, arg or [], input or [], device, seed, json, tb, debug,
                               loss=loss, batch=batch, optimizer=dict(name=optimizer),
                               outputs={"trace": trace, "tb_trace": tb}, checkpoint=checkpoint, strict_checkpoint=strict_checkpoint, dtype=dtype, amp=amp, wrap=wrap)
        c.execute(opts, diag, lambda: diag.Options(
            mode=mode, wait=wait, warmup=warmup, active=active, top=top, record_shapes=record_shapes,
            memory=memory, trace=trace is not None or tb is not None, depth=depth, syncs=syncs),
            render_extra=record, precheck=lambda: check_file(trace, "--trace"))
