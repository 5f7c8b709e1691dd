"""Lazy modules (nn.LazyLinear, LazyConv2d, LazyBatchNorm2d, ...) hold uninitialised parameters until their first
forward: every tensor op on them raises, and they cannot be copied. Before any diagnostic runs, one forward on the
given inputs materialises them, as the user's own first forward would (torch's advice for lazy modules)."""
from __future__ import annotations


def is_uninitialised(t) -> bool:
    """A lazy module's parameter or buffer before its first forward (every op on it raises)."""
    from torch.nn.parameter import UninitializedTensorMixin  # type: ignore[attr-defined]

    return isinstance(t, UninitializedTensorMixin)


def uninitialised(model) -> list[str]:
    """Names of the modules holding uninitialised parameters or buffers."""
    from torch.nn.modules.lazy import LazyModuleMixin

    return [n or "(root)" for n, m in model.named_modules()
            if isinstance(m, LazyModuleMixin) and m.has_uninitialized_params()]   # type: ignore[misc]


def materialise(model, inputs, header: dict) -> None:
    """One forward in eval mode, without grad, under the guard: the parameters and buffers get their shapes and
    initial values, and nothing else is left changed (eval: a lazy BatchNorm's running stats stay at 0 and 1; the
    RNG state the initialisation drew from is put back; the other modules' buffers as they were, while the buffers a
    lazy module registers as it materialises stay: a review's custom one lost its mask). Said in the header. A
    forward that fails is the model's error (ModelError, naming the module); a lazy module the inputs do not reach
    is one too: its parameters have no shape for any command to read."""
    lazy = uninitialised(model)
    if not lazy or inputs is None:
        return
    import torch

    from ..errors import ModelError
    from .guard import leave_no_trace, restore_buffers, snapshot_buffers
    from .tracking import run_forward

    modules = dict(model.named_modules())
    held = {id(modules[n if n != "(root)" else ""]) for n in lazy}
    saved = [entry for entry in snapshot_buffers(model) if id(entry[0]) not in held]
    with leave_no_trace(model, buffers=False), torch.no_grad():
        model.eval()
        try:
            run_forward(model, inputs, phase="forward (materialising lazy modules)")
        finally:
            restore_buffers(saved)
    left = uninitialised(model)
    if left:
        raise ModelError(f"lazy module{'s' if len(left) > 1 else ''} {', '.join(left[:4])} still without a shape after a "
                         "forward on the inputs: the forward does not reach "
                         f"{'them' if len(left) > 1 else 'it'}, and no command can read an uninitialised parameter",
                         hint="give inputs that reach every lazy module (-i, example_inputs()), or run the model once "
                              "on such inputs in its factory")
    shown = ", ".join(lazy[:4]) + (f" and {len(lazy) - 4} more" if len(lazy) > 4 else "")
    header["lazy_modules"] = f"materialised by one forward in eval mode, without grad, before the run: {shown}"
