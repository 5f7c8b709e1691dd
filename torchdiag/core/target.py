"""Everything a command needs before its diagnostic runs: device, model, inputs, header."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Target:
    model: Any
    inputs: Any              # ModelInputs
    device: Any
    loaded: Any              # LoadedModel
    opts: Any                # CommonOptions
    batch_target: Any = None  # target tensor from --batch, if any
    header: dict[str, Any] = field(default_factory=dict)

    def loss(self):
        """The loss rule for commands that run backward (DESIGN.md "Targets and loss")."""
        from .loss import resolve_loss

        return resolve_loss(self.opts.loss, self.loaded, self.batch_target, self.opts.seed)

    def finish(self, result) -> None:
        """Put the choices made for the user in front of the diagnostic's own header."""
        header = dict(self.header)
        header.update(result.header)
        result.header = header


def prepare(opts) -> Target:
    from .device import resolve_device
    from .inputs import ModelInputs, resolve_inputs
    from .loading import load_model

    if opts.batch and opts.inputs:  # one would be silently ignored
        from ..errors import UsageError

        raise UsageError(f"--batch {opts.batch} and -i {' -i '.join(opts.inputs)} both give the inputs",
                         hint="--batch returns (inputs, target): drop -i, or drop --batch")
    device = resolve_device(opts.device)
    loaded = load_model(opts.spec, opts.args, device, opts.seed)
    batch_target = None
    if opts.batch:
        from .loss import load_batch

        inputs, batch_target = load_batch(opts.batch, device, opts.seed)
    elif opts.needs_inputs:
        inputs = resolve_inputs(opts.inputs, loaded, device, opts.seed)
    else:
        inputs = ModelInputs()
    header = {"model": opts.spec, "device": str(device), "seed": opts.seed}
    if loaded.kwargs:
        header["factory_args"] = {k: repr(v) if not isinstance(v, (int, float, str, bool)) else v
                                  for k, v in loaded.kwargs.items()}
    if loaded.built_on:
        header["built_on_meta_via"] = loaded.built_on
    if opts.needs_inputs:
        header["inputs"] = inputs.describe()
        header["input_source"] = inputs.source
        if inputs.notes:
            header["input_notes"] = inputs.notes
    return Target(loaded.model, inputs, device, loaded, opts, batch_target, header)
