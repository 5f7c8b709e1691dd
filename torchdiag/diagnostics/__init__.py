"""One module (or package) per diagnostic. Each declares:

- `Options`: a torch-free dataclass, validated when built (before any model is loaded);
- `run(model, inputs, opts, ctx) -> Result`: data only, never prints or writes files;
- `NEEDS_VALUES = True` when it needs real tensor values (the meta device is then refused once,
  by `core.context`, before the model is built).

Which command runs which module is the registry's (torchdiag/commands.py); running one is the runner's
(torchdiag/runner/)."""
from __future__ import annotations


def module(command: str):
    """The diagnostics module of a command (`overfit-batch` → diagnostics.overfit_batch)."""
    from ..commands import get

    return get(command).diagnostic_module()
