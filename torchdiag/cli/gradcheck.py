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
                  debug: c.Debug = False) -> None:
        """Check the gradients of your own autograd code against numerical ones, in float64.

        Inputs come from -i (float inputs become float64 and are differentiated; integer inputs are
        passed as they are), else example_inputs() in TARGET's module. Reports per input the max
        absolute and relative error between analytical and numerical gradients and, when it fails,
        the input element and output element where it is worst. Exit 0 pass, 1 fail."""
        opts = c.CommonOptions("gradcheck", target, arg or [], input or [], device, seed, json, tb, debug)
        c.execute(opts, None, produce=lambda: _run(opts, second_order, eps, atol, rtol, not no_params))


def _run(opts, second_order, eps, atol, rtol, params):
    import torch

    from ..core.device import resolve_device
    from ..core.inputs import ModelInputs, _normalise, make_tensor, parse_input_spec
    from ..core.loading import find_factory, import_module, parse_args, split_spec
    from ..diagnostics import gradcheck as diag
    from ..errors import ModelError, UsageError, one_line

    device = resolve_device(opts.device)
    if device.type == "meta":
        raise UsageError("gradcheck needs real values; the meta device has none", hint="use --device cpu or cuda")
    where, name = split_spec(opts.spec)
    module = import_module(where)
    obj = find_factory(module, name, where)
    kind, target = diag.resolve_target(obj, parse_args(opts.args), name)
    if kind == "nn.Module":
        target = target.to(device)
    gen = torch.Generator().manual_seed(opts.seed)
    if opts.inputs:
        tensors = []
        for s in opts.inputs:
            spec = parse_input_spec(s)
            if spec.dtype in ("float32", "float16", "bfloat16"):
                spec.dtype = "float64"
            t, _ = make_tensor(spec, device, gen, target if kind == "nn.Module" else None)
            tensors.append(t)
        source = "--input"
    else:
        fn = getattr(module, "example_inputs", None)
        if not callable(fn):
            raise UsageError("no inputs for gradcheck", hint="give small shapes with -i, e.g. -i 3x4 -i 3x4 (one per input), "
                                                             "or an example_inputs() function in the target's module")
        state = torch.random.get_rng_state()
        torch.manual_seed(opts.seed)
        try:
            value = fn()
        except Exception as exc:
            raise ModelError(f"example_inputs() raised {one_line(exc)}") from exc
        finally:
            torch.random.set_rng_state(state)
        args, kwargs = _normalise(value, "example_inputs()")
        if kwargs:
            raise UsageError("gradcheck takes positional inputs; example_inputs() gave a dict", hint="use -i")
        tensors = [t.to(device, torch.float64) if isinstance(t, torch.Tensor) and t.is_floating_point()
                   else (t.to(device) if isinstance(t, torch.Tensor) else t) for t in args]
        source = "example_inputs()"
    diag.check_arity(kind, target, len(tensors), name, "" if source == "--input" else source)
    names = [f"input[{i}]" for i in range(len(tensors))]
    checked = diag.build(kind, target, tensors, names, diag.Options(params=params), name)
    result = diag.run(checked, diag.Options(second_order=second_order, eps=eps, atol=atol, rtol=rtol, params=params))
    shown = ModelInputs(tuple(tensors), {}, source)
    result.header = {"model": opts.spec, "device": str(device), "inputs": shown.describe(), "input_source": source,
                     **result.header}
    return result


