"""Lazy modules (nn.LazyLinear, LazyConv2d, LazyBatchNorm2d, ...) hold uninitialised parameters until their first
forward: every tensor op on them raises, and they cannot be copied. Before any diagnostic runs, one forward on the
given inputs materialises them, as the user's own first forward would (torch's advice for lazy modules)."""
from __future__ import annotations


def uninitialised(model) -> list[str]:
    """Names of the modules holding uninitialised parameters or buffers."""
    from torch.nn.modules.lazy import LazyModuleMixin

    return [n or "(root)" for n, m in model.named_modules()
            if isinstance(m, LazyModuleMixin) and m.has_uninitialized_params()]   # type: ignore[misc]


def materialise(model, inputs, header: dict) -> None:
    """One forward in eval mode, without grad, under the guard: the parameters and buffers get their shapes and
    initial values, and nothing else is left changed (eval: a lazy BatchNorm's running stats stay at 0 and 1; the
    RNG state the initialisation drew from is put back). Said in the header. A forward that fails is the model's
    error (ModelError, naming the module)."""
    lazy = uninitialised(model)
    if not lazy or inputs is None:
        return
    import torch

    from .guard import leave_no_trace
    from .tracking import run_forward

    with leave_no_trace(model), torch.no_grad():
        model.eval()
        run_forward(model, inputs, phase="forward (materialising lazy modules)")
    shown = ", ".join(lazy[:4]) + (f" and {len(lazy) - 4} more" if len(lazy) > 4 else "")
    header["lazy_modules"] = f"materialised by one forward in eval mode, without grad, before the run: {shown}"
