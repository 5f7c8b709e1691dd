"""A made-up float input whose feature width the model's first layer refuses (issue 26). A source's default
layout shapes a float input from what its config says (hidden sizes, mel bins), and some configs name the width
an input layer reads under a key of their own (Granite-Speech 5 reads num_mel_bins × 4 stacked features,
Muse-Glimmer a 64-wide noise embedding): the forward then fails in an nn.Linear handed that input itself, whose
last dimension is not the layer's `in_features`. The probe that failed (core.optional_inputs) records that; the
layout is tried once more with that input's last dimension set to `in_features` (one round: Decision
Transformer's states then run and its actions fail the same way). Only the module that raised counts: the error
that ended the forward came out of nn.Linear's own forward (its traceback, not its text: an error the model
caught earlier is not it), and the layer received the input itself (the tensor, floating point, of the probe's
cast): a width a layer further in refuses is the model's own error, past the input."""
from __future__ import annotations

from typing import Any


def refused(tracker, inputs, exc: BaseException) -> tuple[str, int] | None:
    """(input name, the width the layer reads) when `exc` came out of an nn.Linear's forward and the module that
    raised (the innermost open call) is an nn.Linear given, as its first argument, one of `inputs` (the tensors
    the probe handed the model) whose last dimension is not the layer's in_features; else None."""
    import torch

    stack = getattr(tracker, "_stack", None)
    if not stack or not _from_linear(exc):
        return None
    _, args, _, mod = stack[-1]
    x = args[0] if args else None
    if not isinstance(mod, torch.nn.Linear) or not isinstance(x, torch.Tensor) or not x.is_floating_point():
        return None
    if not x.dim() or x.shape[-1] == mod.in_features:
        return None
    from .inputs import same_data

    for name, t in inputs.tensors():
        if t.is_floating_point() and same_data(x, t) and _top_level(name, inputs):
            return name, int(mod.in_features)
    return None


def _from_linear(exc: BaseException) -> bool:
    """The error was raised inside nn.Linear's own forward (a frame of torch/nn/modules/linear.py)."""
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.replace("\\", "/").endswith("torch/nn/modules/linear.py"):
            return True
        tb = tb.tb_next
    return False


def _top_level(name: str, inputs) -> bool:
    """A positional input (input[i], i one of the positional arguments) or a keyword one, not a tensor nested in
    a list or dict (a keyword argument called `input` holding a list is named input[0] too)."""
    if name.startswith("input[") and name.endswith("]") and name[6:-1].isdigit():
        return int(name[6:-1]) < len(inputs.args) and "input" not in inputs.kwargs
    return "[" not in name and "." not in name


def widened(inputs, name: str, width: int, seed: int):
    """The same inputs with `name`'s last dimension set to `width` (values drawn as a made-up float input is:
    standard normal, seeded); the source says so."""
    import torch

    gen = torch.Generator().manual_seed(seed)

    def remade(t: Any):
        new = torch.randn(*t.shape[:-1], width, generator=gen, dtype=torch.float32).to(t.dtype)
        return new.to(t.device)

    out = inputs.map(lambda t: t)
    if name.startswith("input["):
        i = int(name[len("input["):-1])
        out.args = tuple(remade(a) if j == i else a for j, a in enumerate(out.args))
    else:
        out.kwargs = {k: (remade(v) if k == name else v) for k, v in out.kwargs.items()}
    return out
