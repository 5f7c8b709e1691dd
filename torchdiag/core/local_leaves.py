"""Weights the optimizer cannot see: leaf tensors with requires_grad that the loss's backward reaches
but that are not parameters of the model (`w = torch.randn(..., requires_grad=True)` or a local
`nn.Parameter(...)` made in forward). Found by behaviour: the autograd graph's AccumulateGrad nodes
reachable from the loss, minus the model's parameters and the inputs."""
from __future__ import annotations


def _span(t) -> tuple[int, int] | None:
    """The bytes [start, end) a tensor's elements occupy; None without memory (meta, empty, nested)."""
    try:
        start = t.data_ptr()
        if start == 0 or t.numel() == 0:
            return None
        last = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))
        return start, start + (last + 1) * t.element_size()
    except (RuntimeError, NotImplementedError):
        return None


def _within(span, spans) -> bool:
    return span is not None and any(span[0] < end and start < span[1] for start, end in spans)


def local_leaves(loss, model, inputs=()) -> list:
    """The leaf tensors (requires_grad) the loss's graph accumulates into that are neither parameters
    of `model` nor the `inputs`, in the order the walk meets them (one entry per tensor). A view of an input
    made a leaf in forward is the input still (Hugging Face's wav2vec2-family feature encoders set
    requires_grad on `input_values[:, None]`), judged by the bytes it reads, not its name: a weight cut from the
    same buffer beside the input is still found. A leaf with a row per sample is an activation (_per_sample).
    """
    known = {id(p) for p in model.parameters()} | {id(t) for t in inputs}
    data = [s for s in map(_span, inputs) if s is not None]    # the inputs' own bytes (not all of their storage)
    root = getattr(loss, "grad_fn", None)
    seen, found, stack, out = set(), set(), [root] if root is not None else [], []
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        var = getattr(node, "variable", None)    # AccumulateGrad: the leaf it writes .grad into
        if var is not None and id(var) not in known and id(var) not in found and not _within(_span(var), data) \
                and not _per_sample(var, inputs):
            found.add(id(var))
            out.append(var)
        stack.extend(n for n, _ in node.next_functions)
    return out


def _per_sample(t, inputs) -> bool:
    """A leaf whose shape begins with an input's whole shape (token ids 4x16 -> 4x16x32): a value per input position,
    an activation made to require a gradient, not a weight (Hugging Face's enable_input_require_grads marks the
    embeddings' output so checkpointing reaches past frozen embeddings; a review: local-weight on a 4x16x32 tensor).
    A weight made in forward has no input's shape in it (a 32x5 matrix beside a batch of 32 rows of 20 is found); an
    input of one dimension (one unbatched vector of 64) is the start of any 64 x k matrix, so it is never read so (a
    review). Left: a weight made per sample (x.shape[0] x ...) beside a 2-D input is not found."""
    shape = tuple(t.shape)
    return any(len(dims := tuple(getattr(x, "shape", ()))) >= 2 and len(shape) > len(dims) and shape[:len(dims)] == dims
               for x in inputs)


def describe_leaf(t) -> str:
    """'a 32x20 float32 nn.Parameter' / 'a 32x20 float32 tensor with requires_grad=True'."""
    import torch

    shape = "x".join(map(str, t.shape)) or "scalar"
    kind = "nn.Parameter" if isinstance(t, torch.nn.Parameter) else "tensor with requires_grad=True"
    return f"a {shape} {str(t.dtype).replace('torch.', '')} {kind}"


CODE = "local-weight"
HINT = ("register it in __init__ (self.w = nn.Parameter(...)) so the optimizer holds it and it is created once; "
        "if it should not learn, make it without requires_grad (or a buffer)")


def message(leaves: list, where: str = "") -> str:
    """`leaves`: the tensors, or their describe_leaf texts."""
    texts = [t if isinstance(t, str) else describe_leaf(t) for t in leaves]
    shown = ", ".join(texts[:4]) + (f" … (+{len(texts) - 4})" if len(texts) > 4 else "")
    at = f" in {where}'s forward" if where else " in forward"
    return (f"{len(leaves)} weight(s) made{at} receive a gradient but are not parameters of the model ({shown}): "
            "no optimizer built from model.parameters() can see them, and they are made anew every call")
