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
Amp = Annotated[str, typer.Option("--amp", help="none|bf16|fp16: train under torch.autocast (fp16 with a GradScaler).")]
Plot = Annotated[Optional[Path], typer.Option("--plot", metavar="FILE.png", show_default=False,
                                              help="Save the loss curve (matplotlib; .png, .svg or .pdf).")]

PLOT_SUFFIXES = (".png", ".svg", ".pdf")


def register(app) -> None:
    @app.command("overfit-batch", epilog=EXAMPLE, no_args_is_help=True)
    def overfit_batch(spec: c.Spec, arg: c.Args = None, input: c.Inputs = None, batch: c.Batch = None,
                      loss: c.Loss = "auto", steps: Steps = 500, optimizer: Optimizer = "adam", lr: Lr = None,
                      target_ratio: Ratio = 0.01, target_loss: TargetLoss = None, amp: Amp = "none",
                      device: c.Device = "auto", seed: c.Seed = 0, plot: Plot = None, json: c.Json = False,
                      tb: c.Tb = None, debug: c.Debug = False) -> None:
        """Can this model memorise one batch? Trains a copy on one fixed batch and gives a verdict.

        The classic sanity test before a long run: a correct model, loss and optimizer drive the loss
        on one fixed batch close to zero. The batch is --batch PATH:fn (inputs, target), else the
        model's inputs with targets chosen by the loss rules (--loss). Pass: final loss ≤ target-ratio
        × initial (and 100% batch accuracy for cross-entropy), or ≤ --target-loss. On failure the
        likely causes are checked: non-finite loss, missing or zero gradients, parameters that never
        changed, a flat loss, outputs identical across samples. Your model is not modified."""
        opts = c.CommonOptions("overfit-batch", spec, arg or [], input or [], device, seed, json, tb, debug,
                               loss=loss, batch=batch)
        settings = dict(steps=steps, optimizer=optimizer.strip().lower(), lr=lr, target_ratio=target_ratio,
                        target_loss=target_loss, amp=amp.strip().lower())
        execute(opts, settings, plot)


def _check_plot(plot: Path | None) -> None:
    """--plot before any work: a writable file name with a suffix we write, and matplotlib."""
    from ..errors import UsageError

    if plot is None:
        return
    c.output_file(plot, "--plot", PLOT_SUFFIXES)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UsageError("--plot needs matplotlib, which is not installed",
                         hint="pip install matplotlib, or drop --plot") from None


def write_plot(result, path: Path) -> None:
    """The loss curve (and the pass threshold) as an image."""
    import math

    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    losses = result.series.get("loss", [])
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    try:
        ax.plot(range(len(losses)), losses, lw=1.5, label="loss")
        finite = [v for v in losses if math.isfinite(v)]
        if finite and min(finite) > 0:
            ax.set_yscale("log")
        initial = result.data.get("initial_loss")
        if initial is not None and math.isfinite(initial) and initial > 0:
            ax.axhline(result.data["target_ratio"] * initial, color="tab:green", ls="--", lw=1,
                       label=f"target {result.data['target_ratio']:g} × initial")
        if result.data.get("target_loss") is not None:
            ax.axhline(result.data["target_loss"], color="tab:olive", ls=":", lw=1, label="--target-loss")
        ax.set_xlabel("step")
        ax.set_ylabel("loss")
        verdict = "interrupted" if result.data.get("interrupted") else "PASS" if result.data.get("passed") else "FAIL"
        ax.set_title(f"overfit-batch {result.header.get('model', '')}: {verdict}", fontsize=9)
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(path)
    finally:
        plt.close(fig)


def _progress_bar(json_mode: bool):
    """A live bar on stderr with step, loss and steps/s; None when not a terminal or --json."""
    if json_mode or not sys.stderr.isatty():
        return None
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("overfit-batch"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("loss {task.fields[loss]}"), TextColumn("{task.fields[rate]} steps/s"),
                    TimeElapsedColumn(), console=Console(stderr=True), transient=True)


def execute(opts: c.CommonOptions, settings: dict, plot: Path | None) -> None:
    """Train with a live progress bar (stderr, terminals only), then render; Ctrl-C during
    training returns the partial result, rendered like any other, with exit 130."""
    import time

    from ..diagnostics import overfit_batch as diag

    def run(target):
        options = diag.Options(seed=opts.seed, loss=target.loss(), **settings)
        diag._check_options(options)
        bar = _progress_bar(opts.json)
        if bar is None:
            result = diag.run(target.model, target.inputs, options)
        else:
            with bar:
                task = bar.add_task("train", total=options.steps, loss="—", rate="—")
                first: list[float] = []

                def on_step(step: int, loss: float) -> None:
                    now = time.perf_counter()   # rate from the first evaluation: excludes set-up
                    first.append(now) if not first else None
                    dt = now - first[0]
                    bar.update(task, completed=step, loss=f"{loss:.4g}", rate=f"{step / dt:.1f}" if dt > 0 else "—")

                options.on_step = on_step
                result = diag.run(target.model, target.inputs, options)
        if plot is not None:
            write_plot(result, plot)
            result.data["plot"] = str(plot)
        return result

    def after(result):
        if plot is not None and not opts.json:
            c.err(f"Loss curve: {plot}")
        if result.data.get("interrupted"):
            c.err(f"error: interrupted at step {result.data.get('steps')}: partial result, no verdict")

    c.execute(opts, run, render_extra=after, precheck=lambda: _check_plot(plot))
