"""`torchdiag gradflow`: do gradients reach every parameter, and with healthy magnitudes?"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from . import common as c

EXAMPLE = """Examples:

  torchdiag gradflow sample_models/mlp.py:build -i 16x784

  torchdiag gradflow sample_models/cnn.py:build --depth 2 --plot gradflow.png --tb runs

  torchdiag gradflow sample_models/broken_unused.py:build --allow 'aux_head.*' --allow block.scale --strict --json

Status per parameter: ok · frozen (info) · no-grad (unused | detached: error) · zero-grad (error) ·
exploding-grad (error) · vanishing-grad (warning) · non-finite-grad (error); a flagged gradient re-checked with a short training run on a copy can
become info: by-design-init, zero-init, adaptive-step, bounded-step, transient-grad, small-weight, small-term, cancelled,
loss-scale, closed-on-batch.
Activation warnings:
dead-units (ReLU family), saturated (tanh/sigmoid family). Exit 1 on any error; warnings fail only
with --strict. Exit 2 usage, 3 the model raised, 4 torchdiag bug."""

DETAILS = """Per parameter: grad norm, weight norm, grad/weight ratio, mean and max |grad| and a status; a
parameter with no gradient is called unused (its module never ran, or it was not used) or
detached (its module ran but its output never reached the loss; followed through one more forward:
detached, dropped inside its holder's forward, discarded by the caller of a component that returned it,
or left out of the loss). Per layer, in execution order,
a log-scale bar of mean |grad|. Activation health from the same pass: dead ReLU units and
saturated tanh/sigmoid outputs. Under --amp/--dtype bf16/fp16 an underflow column: the share of
gradient values below the dtype's smallest normal, unscaled (under --amp fp16 the verdicts judge the
gradients scaled by 2**16 and unscaled, as a GradScaler gives them). The model is
left as it was (grads, buffers, flags)."""

OWN = {
    "depth": (c.Depth, 3),
    "vanishing": (Annotated[float, typer.Option("--vanishing", help="grad/weight norm ratio below this is vanishing-grad (grad norm when the weight is all zeros); ≥ 0.")], 1e-7),
    "exploding": (Annotated[float, typer.Option("--exploding", help="grad norm above this is exploding-grad (transient-grad when a short training run on a copy brings it back); ≥ 0.")], 1e3),
    "exploding_ratio": (Annotated[float, typer.Option("--exploding-ratio", help="grad/weight norm ratio above this is exploding-grad; ≥ 0.")], 1e2),
    "dead": (Annotated[float, typer.Option("--dead", help="Fraction of dead units after a ReLU-family module that warns (0 to 1).")], 0.5),
    "saturated": (Annotated[float, typer.Option("--saturated", help="Fraction of saturated tanh/sigmoid outputs that warns (0 to 1).")], 0.5),
    "optimizer": (Annotated[str, typer.Option("--optimizer", help="adam|adamw|sgd: the optimizer a flagged gradient is re-checked with (a short training run on a copy); sgd: momentum 0.9 unless --momentum.")], "adam"),
    "lr": (Annotated[float | None, typer.Option("--lr", show_default=False, help="Learning rate of that run. Default: 1e-3 for adam/adamw, 1e-2 for sgd.")], None),
    "momentum": (c.momentum("0.9"), None),
    "allow": (Annotated[list[str] | None, typer.Option("--allow", metavar="PATTERN", show_default=False, help="Glob on parameter names (module paths for activation warnings) accepted as intentional, e.g. 'aux_head.*'. Repeatable.")], None),
    "strict": (Annotated[bool, typer.Option("--strict", help="Warnings (vanishing-grad, dead-units, saturated) also fail (exit 1).")], False),
    "eval_mode": (Annotated[bool, typer.Option("--eval", help="Run the forward in eval mode (default: train mode, as in training).")], False),
    "all": (Annotated[bool, typer.Option("--all", help="Print the per-parameter table too (always in --json).")], False),
    "plot": (Annotated[Path | None, typer.Option("--plot", parser=c.nonempty_path, metavar="FILE.png", help="Write the gradient-flow figure (max and mean |grad| per layer; .png, .svg or .pdf); needs matplotlib.")], None),
}


def run(o) -> None:
    from ..diagnostics import gradflow as diag

    def precheck():  # before loading anything
        if o.plot is not None:
            from ..render import gradflow as draw

            c.output_file(o.plot, "--plot", draw.PLOT_SUFFIXES)
            draw.check_plot_backend()

    def extra(result, written):
        if "plot" in written and not o.json:
            c.err(f"gradient-flow plot: {written['plot']}")

    # --tb: the per-layer norms are one more TensorBoard writer of render/gradflow.py
    job = c.job("gradflow", o, optimizer=dict(name=o.optimizer, lr=o.lr, momentum=o.momentum), outputs={"plot": o.plot, "tb_layers": o.tb}, precheck=precheck, options=lambda: diag.Options(
        depth=o.depth, vanishing=o.vanishing, exploding=o.exploding, exploding_ratio=o.exploding_ratio, dead=o.dead,
        saturated=o.saturated, allow=list(o.allow or []), strict=o.strict, eval_mode=o.eval_mode,
        histograms=o.tb is not None, all=o.all))
    c.execute(job, render_extra=extra)


def register(app) -> None:
    c.register(app, "gradflow", run, OWN, DETAILS, EXAMPLE)
