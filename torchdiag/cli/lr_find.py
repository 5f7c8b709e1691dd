"""`torchdiag lr-find`: which learning rate? The range test, repeated, its suggestion checked. Exit 0 a
suggestion (or none, with a warning saying why), 1 no rate trains, 130 Ctrl-C."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from . import common as c
from .progress import with_progress

EXAMPLE = """Examples:

  torchdiag lr-find sample_models/mlp.py:build

  torchdiag lr-find sample_models/transformer_lm.py:build --optimizer adamw --plot lr.png

  torchdiag lr-find sample_models/cnn.py:build -i 8x3x32x32 --optimizer sgd --repeats 2 --check-steps 20 --json

  torchdiag lr-find model.py:build --batch data.py:one_batch --loss cross_entropy --min-lr 1e-6 --max-lr 1

  torchrun --nproc_per_node 2 -m torchdiag lr-find model.py:build --wrap ddp

Exit codes: 0 a suggestion (checked or not), or no suggestion with a warning saying why · 1 no rate
trains, or the loss is non-finite before any update · 2 usage error · 3 the model's own code raised ·
4 internal error · 130 interrupted (the curve so far is shown, no suggestion)."""

MinLr = Annotated[float, typer.Option("--min-lr", help="First rate of the range test (> 0).")]
MaxLr = Annotated[float, typer.Option("--max-lr", help="Last rate of the range test (> --min-lr).")]
Steps = Annotated[int, typer.Option("--steps", help="Updates per repeat, the rate growing geometrically (≥ 10).")]
Diverge = Annotated[float, typer.Option("--diverge", help="Stop a repeat once its smoothed loss exceeds this × its "
                                                          "best (> 1).")]
Repeats = Annotated[int, typer.Option("--repeats", help="Range tests over seeds SEED … SEED+N-1 (1–20); their spread "
                                                        "is the band.")]
CheckSteps = Annotated[int, typer.Option("--check-steps", help="Updates of each checked run at 0.1×, 1×, 10× the "
                                                               "suggestion (0: no check, else ≥ 3).")]
Optimizer = Annotated[str, typer.Option("--optimizer", help="adam|adamw|sgd (sgd: momentum 0.9 unless --momentum).")]
Lr = Annotated[float | None, typer.Option("--lr", show_default=False,
                                             help="Not used: the range test sets the rate of every update (a note "
                                                  "says so when given).")]
Plot = Annotated[Path | None, typer.Option("--plot", parser=c.nonempty_path, metavar="FILE.png", show_default=False,
                                              help="Save the curves and the checked runs (matplotlib; .png, .svg or "
                                                   ".pdf).")]

DETAILS = """The learning-rate range test on fresh copies of the model, on one fixed batch: --steps
updates with the rate growing geometrically from --min-lr to --max-lr, the loss read after each
update, a repeat stopped once its smoothed loss exceeds --diverge × its best. It runs --repeats
times (seeds SEED…; the seed draws the random targets torchdiag makes and the forward's RNG), and
the point rules (valley, steepest, min/10) are shown side by side. The suggestion (the valley's
median over the repeats, with its band) is then checked: --check-steps updates at 0.1×, 1× and
10× of it from the same weights; the recommended rate is the one those runs support. A flat or
noisy curve gives no suggestion, never a made-up one. Cost: at most steps × repeats +
3 × check-steps updates (stated in the header). It trains with the run-wide loss, optimizer,
--dtype/--amp and device; --lr is not used. Your model is not modified."""

OWN = {"min_lr": (MinLr, 1e-7), "max_lr": (MaxLr, 10.0), "steps": (Steps, 100), "diverge": (Diverge, 4.0),
       "repeats": (Repeats, 3), "check_steps": (CheckSteps, 30), "optimizer": (Optimizer, "adam"), "lr": (Lr, None), "momentum": (c.momentum("0.9"), None),
       "plot": (Plot, None)}


def run(o) -> None:
    from ..diagnostics import lr_find as diag
    from ..render.plots import check_plot

    job = c.job("lr-find", o, optimizer=dict(name=o.optimizer, lr=o.lr, momentum=o.momentum), outputs={"plot": o.plot},
                options=lambda: diag.Options(min_lr=o.min_lr, max_lr=o.max_lr, steps=o.steps, diverge=o.diverge,
                                             repeats=o.repeats, check_steps=o.check_steps),
                run=with_progress(diag, o.json, "lr-find", "updates", lambda options: options.cost), precheck=lambda: check_plot(o.plot))   # before loading
    c.execute(job, render_extra=_after(o.json))


def register(app) -> None:
    c.register(app, "lr-find", run, OWN, DETAILS, EXAMPLE)


def _after(json_mode: bool):
    def after(result, written: dict) -> None:
        if "plot" in written:
            result.data["plot"] = written["plot"]
            if not json_mode:
                c.err(f"Curves: {written['plot']}")
        if result.data.get("status") == "interrupted":
            c.err(f"error: interrupted after {result.data.get('updates')} update(s): partial result, no suggestion")

    return after
