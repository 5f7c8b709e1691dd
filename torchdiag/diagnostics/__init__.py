"""One module (or package) per diagnostic. Each declares:

- `Options`: a torch-free dataclass, validated when built (before any model is loaded);
- `run(model, inputs, opts, ctx) -> Result`: data only, never prints or writes files;
- `NEEDS_VALUES = True` when it needs real tensor values (the meta device is then refused once,
  by `core.context`, before the model is built).

`invoke` is the one way the Python API and `check` run a diagnostic on a model they already have."""
from __future__ import annotations

import importlib


def module(command: str):
    """The diagnostics module of a command (`overfit-batch` → diagnostics.overfit_batch)."""
    name = command.replace("-", "_")
    return importlib.import_module(f"{__name__}.{name}")


def invoke(diagnostic, model, inputs, opts, ctx):
    if getattr(diagnostic, "NEEDS_VALUES", False):
        ctx.require_values()
    try:
        result = diagnostic.run(model, inputs, opts, ctx)
    except Exception as exc:
        ctx.explain(exc)
        raise
    ctx.finish(result)
    return result
