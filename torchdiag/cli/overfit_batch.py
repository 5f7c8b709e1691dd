"""`torchdiag overfit-batch`: can this model memorise one fixed batch? Exit 0 pass, 1 fail, 130 Ctrl-C."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from . import common as c

EXAMPLE = """Examples:

  torchdiag overfit-batch sample_models/mlp.py:build

  torchdiag overfit-batch sample_models/cnn.py:build -i 8x3x32x32 --optimizer sgd --lr 0.05 --plot loss.png

  torchdiag overfit-batch sample_models/transformer_lm.py:build --steps 1000 --tb runs --json

  torchdiag overfit-batch model.py:build --batch data.py:one_batch --loss cross_entropy --target-loss 0.05

  torchdiag overfit-batch sample_models/precision_steps.py:skips_every_step -i 8x8 --amp fp16 --steps 10

Exit codes: 0 memorised the batch · 1 could not (finding cannot-overfit, with checked causes) ·
2 usage error · 3 the model's own code raised · 4 internal error · 130 interrupted (partial result shown)."""

Steps = Annotated[int, typer.Option("--steps", help="Most optimizer steps; the run stops early at the target.")]
Optimizer = Annotated[str, typer.Option("--optimizer", help="adam|adamw|sgd (sgd uses momentum 0.9).")]
Lr = Annotated[Optional[float], typer.Option("--lr", show_default=False,
                                             help="Learning rate. Default: 1e-3 for adam/adamw, 1e-2 for sgd.")]
Ratio = Annotated[float, typer.Option("--target-ratio", help="Pass when the loss falls to this fraction of its initial value "
                                                            "(and, for cross-entropy, batch accuracy is 100%).")]
TargetLoss = Annotated[Optional[float], typer.Option("--target-loss", show_default=False,
                                                     help="Also pass when the loss falls to this absolute value.")]
Plot = Annotated[Optional[Path], typer.Option("--plot", metavar="FILE.png", show_default=False,
                                              help="Save the loss curve (matplotlib; .png, .svg or .pdf).")]

DETAILS = """The classic sanity test before a long run: a correct model, loss and optimizer drive the loss
on one fixed batch close to zero. The batch is --batch PATH:fn (inputs, target), else the
model's inputs with targets chosen by the loss rules (--loss). Pass: final loss ≤ target-ratio
× initial (and 100% batch accuracy for cross-entropy), or ≤ --target-loss. On failure the
likely causes are checked: non-finite loss, missing or zero gradients, parameters that never
changed, a flat loss, outputs identical across samples. With --amp fp16 the GradScaler's scale
per step and the skipped steps are reported (every step skipped: error every-step-skipped,
naming the module of the first non-finite gradient); with --dtype bfloat16 weights whose first
update rounds away are named (update-rounds-away). Your model is not modified."""

OWN = {"steps": (Steps, 500), "optimizer": (Optimizer, "adam"), "lr": (Lr, None), "target_ratio": (Ratio, 0.01),
       "target_loss": (TargetLoss, None), "plot": (Plot, None)}


def run(o) -> None:
    from ..diagnostics import overfit_batch as diag
    from ..render.overfit_batch import check_plot

    job = c.job("overfit-batch", o, optimizer=dict(name=o.optimizer, lr=o.lr), outputs={"plot": o.plot},
                options=lambda: diag.Options(steps=o.steps, target_ratio=o.target_ratio, target_loss=o.target_loss),
                run=_with_progress(diag, o.json), precheck=lambda: check_plot(o.plot))   # before loading
    c.execute(job, render_extra=_after(o.json))


def register(app) -> None:
    c.register(app, "overfit-batch", run, OWN, DETAILS, EXAMPLE)


def _progress_bar(json_mode: bool):
    """A live bar on stderr with step, loss and steps/s; None when not a terminal or --json."""
    if json_mode or not sys.stderr.isatty():
        return None
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("overfit-batch"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("loss {task.fields[loss]}"), TextColumn("{task.fields[rate]} steps/s"),
                    TimeElapsedColumn(), console=Console(stderr=True), transient=True)


def _with_progress(diag, json_mode: bool):
    """diag.run with a live progress bar (stderr, terminals only). Ctrl-C during training returns
    the partial result (exit 130), rendered like any other."""
    import dataclasses
    import time

    def run(model, inputs, options, ctx):
        bar = _progress_bar(json_mode)
        if bar is None:
            return diag.run(model, inputs, options, ctx)
        with bar:
            task = bar.add_task("train", total=options.steps, loss="—", rate="—")
            first: list[float] = []

            def on_step(step: int, loss: float) -> None:
                now = time.perf_counter()   # rate from the first evaluation: excludes set-up
                first.append(now) if not first else None
                dt = now - first[0]
                bar.update(task, completed=step, loss=f"{loss:.4g}", rate=f"{step / dt:.1f}" if dt > 0 else "—")

            return diag.run(model, inputs, dataclasses.replace(options, on_step=on_step), ctx)

    return run


def _after(json_mode: bool):
    def after(result, written: dict) -> None:
        if "plot" in written:
            result.data["plot"] = written["plot"]
            if not json_mode:
                c.err(f"Loss curve: {written['plot']}")
        if result.data.get("interrupted"):
            c.err(f"error: interrupted at step {result.data.get('steps')}: partial result, no verdict")

    return after
