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


DETAILS = """Inputs come from -i (float inputs become float64 and are differentiated; integer inputs are
passed as they are), else example_inputs() in TARGET's module. Reports per input the max
absolute and relative error between analytical and numerical gradients and, when it fails,
the input element and output element where it is worst. --checkpoint loads weights into an
nn.Module target first (its gradients are checked at those weights). Exit 0 pass, 1 fail."""

OWN = {"second_order": (Second, False), "eps": (Eps, 1e-6), "atol": (Atol, 1e-5), "rtol": (Rtol, 1e-3),
       "no_params": (NoParams, False)}


def run(o) -> None:
    from ..diagnostics import gradcheck as diag

    made = {}

    def options():   # validated before the target is imported
        made["opts"] = diag.Options(second_order=o.second_order, eps=o.eps, atol=o.atol, rtol=o.rtol,
                                    params=not o.no_params)
        return made["opts"]

    job = c.job("gradcheck", o, options=options)
    job.produce = lambda: diag.check_spec(job.run_spec(), made["opts"])
    c.execute(job)


def register(app) -> None:
    c.register(app, "gradcheck", run, OWN, DETAILS, EXAMPLE, target=Target)
