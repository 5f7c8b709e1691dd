"""What closes a path, read from values (core.stops): a module's zero values, confirmed by opening them one at a
time on the copy (the module alone re-run on its recorded arguments), and the zero operand an op saved."""
from __future__ import annotations

import math
import re
from typing import Any

from ..device import widened
from .record import Call, storage


def zero_values(mod) -> list[tuple[str, str, object]]:
    """(kind, name, tensor) of what a module holds directly that is 0 (False) everywhere: buffers, frozen
    parameters, plain tensor attributes."""
    import torch

    def zero(t) -> bool:
        return (isinstance(t, torch.Tensor) and t.numel() > 0 and (t.is_floating_point() or t.is_complex()
                or t.dtype == torch.bool) and not bool(t.detach().any()))

    return [(kind if kind != "parameter" else "frozen parameter", n, t) for kind, n, t in own_tensors(mod)
            if zero(t) and not (kind == "parameter" and t.requires_grad)]


def own_tensors(mod) -> list[tuple[str, str, Any]]:
    """(kind, name, tensor) of what a module holds itself: parameters, buffers, plain tensor attributes."""
    return [("parameter", n, t) for n, t in mod.named_parameters(recurse=False)] + \
        [("buffer", n, t) for n, t in mod.named_buffers(recurse=False) if t is not None] + \
        [("tensor attribute", n, t) for n, t in vars(mod).items() if _is_tensor(t) and not n.startswith("_")]


PROPORTIONAL = 1.5   # a value that gates by multiplying: set to 2 instead of 1, what passes grows this much or more


def opening(mod, call: Call, cut: set[int], ctx) -> list[tuple[str, str]]:
    """(kind, name) of the module's zero values that, set to 1 (True) alone, let a gradient through to the cut
    inputs (`cut`: their tensor ids) when the module runs alone on its recorded arguments, and that multiply
    the path: set to 2, the gradient grows by PROPORTIONAL or more (a zero shift that wakes a dead unit up
    opens it too, and is not what closed it)."""
    if call.args is None:
        return []
    return [(kind, n) for kind, n, t in zero_values(mod) if _gates(mod, call, kind, n, t, cut, ctx)]


def _gates(mod, call: Call, kind: str, name: str, value, cut: set[int], ctx) -> bool:
    import torch

    one = _passed(mod, call, kind, name, value, torch.ones_like(value), cut, ctx)
    if not one > 0:
        return False
    if value.dtype == torch.bool:   # a mask: on or off
        return True
    return _passed(mod, call, kind, name, value, torch.full_like(value, 2), cut, ctx) >= PROPORTIONAL * one


def _passed(mod, call: Call, kind: str, name: str, value, setting, cut: set[int], ctx) -> float:
    """The gradient's norm at the cut inputs with the value swapped for `setting` for the run (not written to:
    the tensor itself, which the measured graph saved and which may be an expanded view, is left as it is);
    0.0 when the module alone does not run."""
    import torch

    store = mod._buffers if kind == "buffer" else mod._parameters if kind == "frozen parameter" else vars(mod)
    store[name] = torch.nn.Parameter(setting, requires_grad=False) if kind == "frozen parameter" else setting
    try:
        return _passes_alone(mod, call, cut, ctx)
    except Exception:   # the module alone does not run on these: no claim
        return 0.0
    finally:
        store[name] = value


def _passes_alone(mod, call: Call, cut: set[int], ctx) -> float:
    """Run the module alone (seeded: the caller's random state kept) on fresh copies of its cut inputs and a
    random weighting of its outputs: the norm of the gradient that reaches them. A copy is cloned once more before it goes in,
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
        return 0.0
    g = torch.Generator().manual_seed(0)   # a random weighting: a sum of outputs can cancel what passes
    total = torch.zeros(())
    for o in outs:
        real = (torch.view_as_real(o) if o.is_complex() else o).float()
        total = total.to(o.device) + real.mul(torch.randn(real.shape, generator=g).to(o.device)).sum()
    grads = torch.autograd.grad(total, list(leaves.values()), allow_unused=True)
    return math.sqrt(sum(float(widened(x).pow(2).sum()) for x in grads if x is not None))


def storage_names_from(modules: dict) -> dict[int, tuple[str, object]]:
    """Where each of the model's tensors lives (its storage) -> (how to call it: `kind `name` of module`, the
    tensor). `modules`: the model's named modules."""
    out: dict[int, tuple[str, object]] = {}
    for mname, mod in modules.items():
        for kind, n, t in own_tensors(mod):
            out.setdefault(storage(t), (f"{kind} `{n}` of {mname or '(root)'}", t))
    return out


def zero_operand(node, kid, names: dict, stuck: set | None = None) -> tuple[str, str] | None:
    """What an op saved that closes it, as (kind, text): "model" (one of the model's tensors, named; a part of
    it when only a view of it is zero) or "made" (made in the forward) for a zero operand off the gradient's
    path — a product's other factor, a mask, a layer norm's scale —; "padding" for an embedding lookup of
    nothing but its padding index; "path" when the value on the gradient's path (made by `kid`) is itself 0
    everywhere (abs at 0); "result" when its own saved output is 0 everywhere (a relu with every unit below
    zero); None when it saved none of these."""
    padding = _padding_only(node)
    if padding is not None:
        return padding
    zero, on_path = _saved_zero(node, kid, stuck or set())
    if zero is None:
        rows = _one_hot_rows(node)
        return ("path", "") if on_path else ("result", "") if _zero_result(node) else \
            ("one-hot", "") if _one_hot(node) else ("one-hot-rows", rows) if rows else None
    label, whole = names.get(storage(zero), (None, None))
    if label is not None and storage(zero) in (stuck or set()):
        return "stuck", label
    if label is None:
        return "made", "a value made in the forward"
    return "model", label if not bool(whole.detach().any()) else f"a part of {label}"


def zero_tensor(node, kid, stuck: set | None = None):
    """The zero operand an op saved off the gradient's path (see zero_operand), or None."""
    return _saved_zero(node, kid, stuck or set())[0]


def _saved_zero(node, kid, stuck: set) -> tuple[object, bool]:
    """(the first saved tensor of `node` that is 0 everywhere and not the value on the path, whether the value on
    the path — made by `kid` — is itself 0 everywhere)."""
    import torch

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
        if not (t.is_floating_point() or t.is_complex() or t.dtype == torch.bool) or bool(t.detach().any()):
            continue
        if t.requires_grad and (t.grad_fn is kid or getattr(kid, "variable", None) is t):
            on_path = True
            continue
        if t.requires_grad and t.grad_fn is node:   # the op's own output (relu saves it): not an operand
            continue
        if t.requires_grad and t.grad_fn is None and storage(t) not in stuck:   # a trainable 0 (a bias): training moves it
            continue
        return t, on_path
    return None, on_path


def _one_hot(node) -> bool:
    """Did the op save its own output as probabilities that are all 0 or 1 (a softmax saturated to one-hot, whose
    derivative is then 0)?"""
    t = _saved_result(node)
    return t is not None and bool(((t == 0) | (t == 1)).all()) and bool((t == 1).any())


def _one_hot_rows(node) -> str:
    """"k of n": a softmax whose saved output has k of its n rows (along its own dimension) one-hot, some but not
    all: a row over one position (causal attention's first query, which sees itself alone) or with every other
    logit masked passes no gradient; "" otherwise."""
    t, dim = _saved_result(node), getattr(node, "_saved_dim", None)
    if t is None or not isinstance(dim, int) or t.dim() < 2:
        return ""
    dim = dim - 2 ** 64 if dim >= 2 ** 63 else dim
    if not -t.dim() <= dim < t.dim():
        return ""
    one = (((t == 0) | (t == 1)).all(dim) & (t == 1).any(dim))
    k = int(one.sum())
    return f"{k:,} of {one.numel():,}" if 0 < k < one.numel() else ""


def _zero_result(node) -> bool:
    """Did the op save its own output, and is that 0 everywhere (a relu whose every unit is below zero)?"""
    t = _saved_result(node)
    return t is not None and not bool(t.any())


def _saved_result(node):
    """The op's own output, when it saved it (relu, softmax) as a non-empty float tensor; else None."""
    import torch

    try:
        t = getattr(node, "_saved_result", None)
    except Exception:
        return None
    ok = isinstance(t, torch.Tensor) and t.numel() > 0 and t.is_floating_point()
    return t.detach() if ok else None


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


def padding_ids(node):
    """The index tensor an embedding lookup saved (None when it saved none)."""
    try:
        return node._saved_indices
    except Exception:
        return None


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


# ops that only move values: when one "passes none" on the edge to a parameter, that part of the gradient was
# already 0 where the op's output is read (a mask, a max-pool, a selection after it); the op itself is not it.
# The scatters too: an MoE's index_add puts an expert's rows into the tokens' rows, and its backward gathers them
# (a review: an expert picked only by padded tokens, masked after the index_add, was a zero-grad error)
ROUTES = frozenset({"cat", "stack", "split", "split_with_sizes", "select", "slice", "index", "unbind", "narrow",
                    "unsqueeze", "squeeze", "view", "reshape", "expand", "permute", "transpose", "t", "as_strided",
                    "copy_slices", "clone", "unsafe_view", "unsafe_split", "chunk", "index_select", "gather",
                    "index_add", "index_copy", "index_put", "scatter", "scatter_add", "masked_scatter"})
