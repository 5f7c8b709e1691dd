"""A made-up float input whose feature width the model's first layer refuses (issue 26). A source's default
layout shapes a float input from what its config says (hidden sizes, mel bins), and some configs name the width
an input layer reads under a key of their own (Decision Transformer's `state_dim` 17, Granite-Speech's 320-wide
stacked features, Muse-Glimmer's 64-wide noise embeddings): the forward then fails in an nn.Linear handed that
input itself, whose last dimension is not the layer's `in_features`. The probe that failed (core.optional_inputs)
records that; the layout is tried once more with that input's last dimension set to `in_features`. Only the module
that raised counts, and only when it received the input itself (same shape, floating point): a width a layer
further in refuses is the model's own error, past the input."""
from __future__ import annotations

from typing import Any


def refused(tracker, inputs) -> tuple[str, int] | None:
    """(input name, the width the layer reads) when the module that raised (the innermost open call) is an
    nn.Linear given, as its first argument, a floating input of the same shape whose last dimension is not
    the layer's in_features; else None."""
    import torch

    stack = getattr(tracker, "_stack", None)
    if not stack:
        return None
    _, args, _, mod = stack[-1]
    x = args[0] if args else None
    if not isinstance(mod, torch.nn.Linear) or not isinstance(x, torch.Tensor) or not x.is_floating_point():
        return None
    if not x.dim() or x.shape[-1] == mod.in_features:
        return None
    from .inputs import same_data

    given = [(name, t) for name, t in inputs.tensors() if t.is_floating_point() and t.shape == x.shape
             and _top_level(name)]
    # the tensor itself first (two inputs of one shape: the one the layer got); a cast copy by its shape
    ranked = sorted(given, key=lambda nt: not same_data(x, nt[1]))
    return (ranked[0][0], int(mod.in_features)) if ranked else None


def _top_level(name: str) -> bool:
    """A positional input (input[i]) or a keyword one, not a tensor nested in a list or dict."""
    head, _, rest = name.partition("[")
    return (head == "input" and rest.count("[") == 0) or ("[" not in name and "." not in name)


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
