"""`torchdiag gradcheck`: numerical vs analytical gradients of the user's own autograd code."""
from __future__ import annotations

from typing import Annotated

import typer

from . import common as c

EXAMPLE = """Examples:

  torchdiag gradcheck sample_models/custom_autograd.py:MulSquare -i 3 -i 3

  torchdiag gradcheck sample_models/custom_autograd.py:DetachedCube -i 4 --second-order

  torchdiag gradcheck sample_models/custom_autograd.py:ScaledTanh --arg features=3 -i 2x3 --json"""

Target = Annotated[str, typer.Argument(metavar="TARGET", show_default=False,
                                       help="file.py:Name or module:Name naming a torch.autograd.Function subclass, "
                                            "an nn.Module (class, built with --arg) or a function.")]
Second = Annotated[bool, typer.Option("--second-order", help="Also check second derivatives (torch.autograd.gradgradcheck).")]
Eps = Annotated[float, typer.Option("--eps", help="Finite-difference step (central differences).")]
Atol = Annotated[float, typer.Option("--atol", help="Absolute tolerance.")]
Rtol = Annotated[float, typer.Option("--rtol", help="Relative tolerance.")]
NoParams = Annotated[bool, typer.Option("--no-params", help="nn.Module targets: check only inputs, not parameters.")]


def register(app) -> None:
    @app.command("gradcheck", epilog=EXAMPLE, no_args_is_help=True)
    def gradcheck(target: Target, input: c.Inputs = None, arg: c.Args = None, second_order: Second = False,
                  eps: Eps = 1e-6, atol: Atol = 1e-5, rtol: Rtol = 1e-3, no_params: NoParams = False,
                  device: c.Device = "cpu", seed: c.Seed = 0, json: c.Json = False, tb: c.Tb = None,
                  debug: c.Debug = False, checkpoint: c.Checkpoint = None,
                  strict_checkpoint: c.StrictCheckpoint = True) -> None:
        """Check the gradients of your own autograd code against numerical ones, in float64.

        Inputs come from -i (float inputs become float64 and are differentiated; integer inputs are
        passed as they are), else example_inputs() in TARGET's module. Reports per input the max
        absolute and relative error between analytical and numerical gradients and, when it fails,
        the input element and output element where it is worst. --checkpoint loads weights into an
        nn.Module target first (its gradients are checked at those weights). Exit 0 pass, 1 fail."""
        from ..diagnostics import gradcheck as diag

        opts = c.CommonOptions("gradcheck", target, arg or [], input or [], device, seed, json, tb, debug,
                               checkpoint=checkpoint, strict_checkpoint=strict_checkpoint)
        made = {}

        def options():   # validated by execute before the target is imported
            made["opts"] = diag.Options(second_order=second_order, eps=eps, atol=atol, rtol=rtol, params=not no_params)
            return made["opts"]

        c.execute(opts, diag, options, produce=lambda: diag.check_spec(opts.run_spec(diag), made["opts"]))
