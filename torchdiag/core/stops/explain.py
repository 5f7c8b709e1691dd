"""What closes a path, read from values (core.stops): a module's zero values, confirmed by opening them one at a
time on the copy (the module alone re-run on its recorded arguments), and the zero operand an op saved."""
from __future__ import annotations

import re

from .record import Call


def zero_values(mod) -> list[tuple[str, str, object]]:
    """(kind, name, tensor) of what a module holds directly that is 0 (False) everywhere: buffers, frozen
    parameters, plain tensor attributes."""
    import torch

    def zero(t) -> bool:
        return (isinstance(t, torch.Tensor) and t.numel() > 0 and (t.is_floating_point() or t.is_complex()
                or t.dtype == torch.bool) and not bool(t.detach().any()))

    out = [("buffer", n, t) for n, t in mod.named_buffers(recurse=False) if zero(t)]
    out += [("frozen parameter", n, t) for n, t in mod.named_parameters(recurse=False) if not t.requires_grad and zero(t)]
    out += [("tensor attribute", n, t) for n, t in vars(mod).items()
            if not n.startswith("_") and isinstance(t, torch.Tensor) and not isinstance(t, torch.nn.Parameter) and zero(t)]
    return out


def opening(mod, call: Call, cut: set[int], ctx) -> list[tuple[str, str]]:
    """(kind, name) of the module's zero values that, set to 1 (True) alone, let a gradient through to the cut
    inputs (`cut`: their tensor ids) when the module runs alone on its recorded arguments."""
    if call.args is None:
        return []
    return [(kind, n) for kind, n, t in zero_values(mod) if _opens(mod, call, kind, n, t, cut, ctx)]


def _opens(mod, call: Call, kind: str, name: str, value, cut: set[int], ctx) -> bool:
    """The value is swapped for ones for the run, not written to: the tensor itself (which the measured graph
    saved, and which may be an expanded view) is left as it is."""
    import torch

    store = mod._buffers if kind == "buffer" else mod._parameters if kind == "frozen parameter" else vars(mod)
    ones = torch.ones_like(value)
    store[name] = torch.nn.Parameter(ones, requires_grad=False) if kind == "frozen parameter" else ones
    try:
        return _passes_alone(mod, call, cut, ctx)
    except Exception:   # the module alone does not run on these: no claim
        return False
    finally:
        store[name] = value


def _passes_alone(mod, call: Call, cut: set[int], ctx) -> bool:
    """Run the module alone (seeded: the caller's random state kept) on fresh copies of its cut inputs and a
    random weighting of its outputs: does a gradient reach them? A copy is cloned once more before it goes in,
    so a module that writes into its input in place can."""
    import torch

    from .record import floats

    leaves: dict[int, torch.Tensor] = {}

    def fresh(obj):
        if isinstance(obj, torch.Tensor):
            if id(obj) not in cut:
                return obj
            leaf = leaves.setdefault(id(obj), obj.detach().clone().requires_grad_())
            return leaf.clone()
        if isinstance(obj, tuple) and hasattr(obj, "_fields"):
            return type(obj)(*map(fresh, obj))
        if isinstance(obj, (list, tuple)):
            return type(obj)(fresh(o) for o in obj)
        if isinstance(obj, dict):
            return {k: fresh(v) for k, v in obj.items()}
        return obj

    assert call.args is not None
    args, kwargs = call.args
    with torch.enable_grad(), ctx.seeded(), ctx.autocast():
        outs = [o for o in floats(mod(*fresh(args), **fresh(kwargs))) if o.requires_grad]
    if not outs or not leaves:
        return False
    g = torch.Generator().manual_seed(0)   # a random weighting: a sum of outputs can cancel what passes
    total = torch.zeros(())
    for o in outs:
        real = (torch.view_as_real(o) if o.is_complex() else o).float()
        total = total.to(o.device) + real.mul(torch.randn(real.shape, generator=g).to(o.device)).sum()
    grads = torch.autograd.grad(total, list(leaves.values()), allow_unused=True)
    return any(x is not None and bool(x.ne(0).any()) for x in grads)


def storage_names_from(modules: dict) -> dict[int, str]:
    """Where each of the model's tensors lives (its storage) -> how to call it: `kind `name` of module`.
    `modules`: the model's named modules."""
    out: dict[int, str] = {}
    for mname, mod in modules.items():
        where = mname or "(root)"
        for kind, n, t in [("parameter", n, t) for n, t in mod.named_parameters(recurse=False)] + \
                [("buffer", n, t) for n, t in mod.named_buffers(recurse=False) if t is not None] + \
                [("tensor attribute", n, t) for n, t in vars(mod).items() if _is_tensor(t) and not n.startswith("_")]:
            out.setdefault(_storage(t), f"{kind} `{n}` of {where}")
    return out


def zero_operand(node, names: dict[int, str]) -> tuple[str, str] | None:
    """What an op saved that closes it, as (kind, text): "model" (one of the model's tensors, named) or "made"
    (made in the forward) for a zero operand — a product's other factor, a mask, a layer norm's scale —;
    "padding" for an embedding lookup of nothing but its padding index; "path" when the value on the
    gradient's path is itself 0 everywhere (relu or abs at 0); None when it saved none of these."""
    import torch

    padding = _padding_only(node)
    if padding is not None:
        return padding
    on_path = False
    for attr in dir(node):
        if not attr.startswith("_saved_"):
            continue
        try:
            t = getattr(node, attr)
        except Exception:   # freed, or not a tensor the binding can return
            continue
        if not isinstance(t, torch.Tensor) or t.numel() == 0:
            continue
        if (t.is_floating_point() or t.is_complex() or t.dtype == torch.bool) and not bool(t.detach().any()):
            if not t.requires_grad:
                name = names.get(_storage(t))
                return ("model", name) if name else ("made", "a value made in the forward")
            on_path = True
    return ("path", "") if on_path else None


def _padding_only(node) -> tuple[str, str] | None:
    """An embedding lookup whose every index is its padding index (whose row gets no gradient by definition)."""
    pad = getattr(node, "_saved_padding_idx", None)
    try:
        idx = node._saved_indices if isinstance(pad, int) and pad >= 0 else None
    except Exception:
        return None
    if idx is None or idx.numel() == 0 or not bool((idx == pad).all()):
        return None
    return "padding", str(pad)


def op_name(node) -> str:
    """An autograd node's op: `MaskedFillBackward0` -> `masked_fill`; a custom autograd Function by its class."""
    import torch

    base = re.sub(r"Backward\d*$", "", type(node).__name__) or type(node).__name__
    if isinstance(node, torch.autograd.function.BackwardCFunction):
        return f"{base}.apply"
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", base).lower()


def _is_tensor(t) -> bool:
    import torch

    return isinstance(t, torch.Tensor) and not isinstance(t, torch.nn.Parameter)


def _storage(t) -> int:
    try:
        return t.untyped_storage().data_ptr()
    except Exception:
        return id(t)
