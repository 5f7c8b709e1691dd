"""`torchdiag overfit-batch`: can this model memorise one fixed batch? Exit 0 pass, 1 fail, 130 Ctrl-C."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from . import common as c
from .progress import with_progress

EXAMPLE = """Examples:

  torchdiag overfit-batch sample_models/mlp.py:build

  torchdiag overfit-batch sample_models/cnn.py:build -i 8x3x32x32 --optimizer sgd --lr 0.05 --plot loss.png

  torchdiag overfit-batch sample_models/transformer_lm.py:build --steps 1000 --tb runs --json

  torchdiag overfit-batch model.py:build --batch data.py:one_batch --loss cross_entropy --target-loss 0.05

  torchdiag overfit-batch sample_models/precision_steps.py:skips_every_step -i 8x8 --amp fp16 --steps 10

Exit codes: 0 memorised the batch · 1 could not (finding cannot-overfit, with checked causes) ·
2 usage error · 3 the model's own code raised · 4 internal error · 130 interrupted (partial result shown)."""

Steps = Annotated[int | None, typer.Option("--steps", show_default=False,
                                           help="Most optimizer steps; the run stops early at the target. Default: 500, "
                                                "extended (up to 2000; 20,000 for a model whose steps are cheap) while the loss still falls toward the target.")]
Optimizer = Annotated[str, typer.Option("--optimizer", help="adam|adamw|sgd (sgd: momentum 0.9 unless --momentum).")]
Lr = Annotated[float | None, typer.Option("--lr", show_default=False,
                                             help="Learning rate. Default: 1e-3 for adam/adamw, 1e-2 for sgd.")]
Ratio = Annotated[float, typer.Option("--target-ratio", help="Pass when the loss falls to this fraction of its initial value "
                                                            "(and, for cross-entropy, batch accuracy is 100%).")]
TargetLoss = Annotated[float | None, typer.Option("--target-loss", show_default=False,
                                                     help="Also pass when the loss falls to this absolute value.")]
Plot = Annotated[Path | None, typer.Option("--plot", parser=c.nonempty_path, metavar="FILE.png", show_default=False,
                                              help="Save the loss curve (matplotlib; .png, .svg or .pdf).")]

DETAILS = """The classic sanity test before a long run: a correct model, loss and optimizer drive the loss
on one fixed batch close to zero. The batch is --batch PATH:fn (inputs, target), else the
model's inputs with targets chosen by the loss rules (--loss). Pass: final loss ≤ target-ratio
× initial (and 100% batch accuracy for cross-entropy), or ≤ --target-loss; against torchdiag's own
regression target, × 10 times the loss of answering every sample with its mean when that is lower. On failure the
likely causes are checked: non-finite loss, missing or zero gradients, parameters that never
changed, a flat loss, outputs identical across samples. With --amp fp16 the GradScaler's scale
per step and the skipped steps are reported (every step skipped: error every-step-skipped,
naming the module of the first non-finite gradient); with --dtype bfloat16 weights whose updates
round away (counted at the first step and at steps 3, 5, 9, 17, …) are named (update-rounds-away). Your model is not modified."""

OWN = {"steps": (Steps, None), "optimizer": (Optimizer, "adam"), "lr": (Lr, None), "momentum": (c.momentum("0.9"), None), "target_ratio": (Ratio, 0.01),
       "target_loss": (TargetLoss, None), "plot": (Plot, None)}


def run(o) -> None:
    from ..diagnostics import overfit_batch as diag
    from ..render.plots import check_plot

    job = c.job("overfit-batch", o, optimizer=dict(name=o.optimizer, lr=o.lr, momentum=o.momentum), outputs={"plot": o.plot},
                options=lambda: diag.Options(steps=o.steps, target_ratio=o.target_ratio, target_loss=o.target_loss),
                run=with_progress(diag, o.json, "overfit-batch", "steps", lambda options: options.budget), precheck=lambda: check_plot(o.plot))   # before loading
    c.execute(job, render_extra=_after(o.json))


def register(app) -> None:
    c.register(app, "overfit-batch", run, OWN, DETAILS, EXAMPLE)


def _after(json_mode: bool):
    def after(result, written: dict) -> None:
        if "plot" in written:
            result.data["plot"] = written["plot"]
            if not json_mode:
                c.err(f"Loss curve: {written['plot']}")
        if result.data.get("interrupted"):
            c.err(f"error: interrupted at step {result.data.get('steps')}: partial result, no verdict")

    return after
