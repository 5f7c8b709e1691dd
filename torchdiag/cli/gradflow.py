"""`torchdiag gradflow`: do gradients reach every parameter, and with healthy magnitudes?"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from . import common as c

EXAMPLE = """Examples:

  torchdiag gradflow sample_models/mlp.py:build -i 16x784

  torchdiag gradflow sample_models/cnn.py:build --depth 2 --plot gradflow.png --tb runs

  torchdiag gradflow sample_models/broken_unused.py:build --allow 'aux_head.*' --allow block.scale --strict --json

Status per parameter: ok · frozen (info) · no-grad (unused | detached: error) · zero-grad (error) ·
exploding-grad (error) · vanishing-grad (warning) · non-finite-grad (error). Activation warnings:
dead-units (ReLU family), saturated (tanh/sigmoid family). Exit 1 on any error; warnings fail only
with --strict. Exit 2 usage, 3 the model raised, 4 torchdiag bug."""


def register(app) -> None:
    @app.command("gradflow", epilog=EXAMPLE, no_args_is_help=True)
    def gradflow(
        spec: c.Spec, arg: c.Args = None, input: c.Inputs = None, device: c.Device = "auto",
        loss: c.Loss = "auto", batch: c.Batch = None, depth: c.Depth = 3, seed: c.Seed = 0,
        vanishing: Annotated[float, typer.Option("--vanishing", help="grad/weight norm ratio below this is vanishing-grad (grad norm when the weight is all zeros); ≥ 0.")] = 1e-7,
        exploding: Annotated[float, typer.Option("--exploding", help="grad norm above this is exploding-grad; ≥ 0.")] = 1e3,
        exploding_ratio: Annotated[float, typer.Option("--exploding-ratio", help="grad/weight norm ratio above this is exploding-grad; ≥ 0.")] = 1e2,
        dead: Annotated[float, typer.Option("--dead", help="Fraction of dead units after a ReLU-family module that warns (0 to 1).")] = 0.5,
        saturated: Annotated[float, typer.Option("--saturated", help="Fraction of saturated tanh/sigmoid outputs that warns (0 to 1).")] = 0.5,
        allow: Annotated[Optional[list[str]], typer.Option("--allow", metavar="PATTERN", show_default=False, help="Glob on parameter names (module paths for activation warnings) accepted as intentional, e.g. 'aux_head.*'. Repeatable.")] = None,
        strict: Annotated[bool, typer.Option("--strict", help="Warnings (vanishing-grad, dead-units, saturated) also fail (exit 1).")] = False,
        eval_mode: Annotated[bool, typer.Option("--eval", help="Run the forward in eval mode (default: train mode, as in training).")] = False,
        plot: Annotated[Optional[Path], typer.Option("--plot", metavar="FILE.png", help="Write the gradient-flow figure (max and mean |grad| per layer; .png, .svg or .pdf); needs matplotlib.")] = None,
        json: c.Json = False, tb: c.Tb = None, debug: c.Debug = False, checkpoint: c.Checkpoint = None, strict_checkpoint: c.StrictCheckpoint = True, dtype: c.Dtype = None, amp: c.Amp = None, wrap: c.Wrap = "none",
    ) -> None:
        """Does the gradient reach every parameter, and in what shape? One forward + backward.

        Per parameter: grad norm, weight norm, grad/weight ratio, mean and max |grad| and a status; a
        parameter with no gradient is called unused (its module never ran, or it was not used) or
        detached (its module ran but its output never reached the loss). Per layer, in execution order,
        a log-scale bar of mean |grad|. Activation health from the same pass: dead ReLU units and
        saturated tanh/sigmoid outputs. Under --amp/--dtype bf16/fp16 an underflow column: the share of
        gradient values below the dtype's smallest normal (no loss scaling in this pass). The model is
        left as it was (grads, buffers, flags)."""
        from ..diagnostics import gradflow as diag

        # --tb: the per-layer norms are one more TensorBoard writer of render/gradflow.py
        opts = c.CommonOptions("gradflow", spec, arg or [], input or [], device, seed, json, tb, debug,
                               loss=loss, batch=batch, outputs={"plot": plot, "tb_layers": tb}, checkpoint=checkpoint, strict_checkpoint=strict_checkpoint, dtype=dtype, amp=amp, wrap=wrap)

        def precheck():  # before loading anything
            if plot is not None:
                from ..render import gradflow as draw

                c.output_file(plot, "--plot", draw.PLOT_SUFFIXES)
                draw.check_plot_backend()

        def extra(result, written):
            if "plot" in written and not json:
                c.err(f"gradient-flow plot: {written['plot']}")

        c.execute(opts, diag, lambda: diag.Options(
            depth=depth, vanishing=vanishing, exploding=exploding, exploding_ratio=exploding_ratio, dead=dead,
            saturated=saturated, allow=list(allow or []), strict=strict, eval_mode=eval_mode,
            histograms=tb is not None), render_extra=extra, precheck=precheck)
