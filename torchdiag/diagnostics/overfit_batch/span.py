"""The floor a last layer's span leaves under torchdiag's own random target: an output that is its last Linear's or
Conv's output moved around (reshaped, permuted, pixel-shuffled) holds, per row of that layer, an affine function of
`h` inputs; with fewer inputs than outputs and more rows than inputs no trained model fits random rows, and the best
any can do is a rank-h fit. A sweep: transformers' masked-image-modelling heads (ViT, Swin: a 1x1 convolution from 32
or 192 channels to 192 or 768 values per patch, then PixelShuffle) levelled at 0.454 and 0.201 x the start, the SVD's
floor for their shapes, and were a false cannot-overfit."""
from __future__ import annotations

import math

MAX_WORK = 2e10     # rows·width·min(rows, width) of the Gram matrix: beyond, the floor is not asked
MAX_SIDE = 3000     # the Gram matrix's side at most (its eigenvalues: side³ work)
MAX_IDS = 1 << 23   # float32 holds the half-integer ids (_rearrangement) exactly below this


def span_floor(model, call, y, t, start: dict | None = None) -> dict | None:
    """_span's reading, the model's buffers put back after it (its forwards run in the copy's train mode)."""
    from ...core.guard import restore_buffers, snapshot_buffers

    saved = snapshot_buffers(model)
    try:
        return _span(model, call, y, t, start)
    finally:
        restore_buffers(saved)


def _span(model, call, y, t, start: dict | None = None) -> dict | None:
    """{kind, floor, fixed, real} when `y` (the trained model's output, from `call(model)`) is a rearrangement of its
    last weighted layer's output and that layer's span cuts the random target `t`; else None. `fixed`: the floor
    the layer's inputs at `start` (the trainable weights before training) leave a least-squares fit, or None where it
    is not read (a convolution wider than 1x1). Three no-grad forwards."""
    import torch

    if not isinstance(y, torch.Tensor) or y.shape != t.shape or not y.is_floating_point() or y.numel() >= MAX_IDS:
        return None
    last = _last_layer(model, call, y.numel())
    if last is None:
        return None
    name, layer, shape = last
    perm = _rearrangement(model, call, layer, shape, y)
    inner = _inputs_per_row(layer)
    if perm is None or inner is None:
        return None
    h, width = inner
    rows = math.prod(shape) // width
    rank = h + (layer.bias is not None)
    if rank >= min(rows, width) or min(rows, width) > MAX_SIDE or rows * width * min(rows, width) > MAX_WORK:
        return None
    flat = torch.empty(y.numel(), dtype=torch.float64, device="cpu")
    flat[perm] = t.detach().reshape(-1).to("cpu", torch.float64)
    target = _as_rows(flat.reshape(shape), layer)
    return {"kind": f"the span of its last layer, {name} (a {_what(layer)} of {h} inputs per output row: rank ≤ {rank} "
                    f"over {rows} rows of {width} values)",
            "floor": _rank_fit(target, h, layer.bias is not None),
            "fixed": _fixed_fit(model, call, layer, start, target) if start is not None else None, "span": True,
            "constant": float((t - t.mean(0, keepdim=True)).square().mean()) if t.dim() and t.shape[0] > 1 else None,
            "real": "more detail in a row than the layer's inputs carry"}


def _as_rows(x, layer):
    """A layer's output or input as (rows, features): a Linear's features last, a convolution's channels at dim 1
    (dim 0 unbatched)."""
    import torch

    if isinstance(layer, torch.nn.Linear):
        return x.reshape(-1, x.shape[-1])
    ch = 1 if x.dim() == len(layer.kernel_size) + 2 else 0
    return x.movedim(ch, -1).reshape(-1, x.shape[ch])


def _what(layer) -> str:
    import torch

    return "Linear" if isinstance(layer, torch.nn.Linear) else "convolution"


def _rank_fit(target, h: int, bias: bool) -> float:
    """The mse left by the best rank-h fit of the rows (Eckart-Young; a bias takes each column's mean first), from
    the smaller side's Gram matrix (the same non-zero eigenvalues)."""
    import torch

    if bias:
        target = target - target.mean(0)
    gram = target @ target.T if target.shape[0] < target.shape[1] else target.T @ target
    eig = torch.linalg.eigvalsh(gram).clamp_min(0)   # ascending: the squared singular values
    return float(eig.sum() - eig[len(eig) - h:].sum()) / target.numel()


def _fixed_fit(model, call, layer, start: dict, target) -> float | None:
    """The mse a least-squares fit of the target rows leaves on the layer's inputs as they were before training (the
    trained weights swapped for `start` for one forward, then put back): what a model that learned nothing before
    the layer reaches. None for a convolution other than 1x1 at stride 1 (its rows read patches)."""
    import torch

    if not isinstance(layer, torch.nn.Linear) and (any(k != 1 for k in layer.kernel_size)
                                                     or any(s != 1 for s in layer.stride)):
        return None
    seen: dict = {}
    params = dict(model.named_parameters())
    with torch.no_grad():
        trained = {n: params[n].detach().clone() for n in start if n in params}
        handle = layer.register_forward_pre_hook(lambda m, args: seen.setdefault("x", args[0].detach().clone()))
        try:
            for n, v in start.items():
                if n in params:
                    params[n].copy_(v)
            call(model)
        finally:
            handle.remove()
            for n, v in trained.items():
                params[n].copy_(v)
    if "x" not in seen:
        return None
    x = _as_rows(seen["x"].to("cpu", torch.float64), layer)
    if x.shape[0] != target.shape[0]:
        return None
    x = torch.cat([x, torch.ones_like(x[:, :1])], dim=1) if layer.bias is not None else x
    fit = x @ torch.linalg.lstsq(x, target).solution
    return float((target - fit).square().sum()) / target.numel()


def _last_layer(model, call, numel: int):
    """(name, module, output shape) of the last Linear or convolution a forward called whose output holds as many
    values as the model's output, or None."""
    import torch

    seen: list = []
    kinds = (torch.nn.Linear, torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)
    names = {m: n for n, m in model.named_modules() if isinstance(m, kinds)}
    handles = [m.register_forward_hook(lambda m, a, out: seen.append((m, tuple(out.shape))
                                                                        if isinstance(out, torch.Tensor) else None))
               for m in names]
    try:
        with torch.no_grad():
            call(model)
    finally:
        for h in handles:
            h.remove()
    if not seen or seen[-1] is None or math.prod(seen[-1][1]) != numel:
        return None
    module, shape = seen[-1]
    return names[module], module, shape


def _rearrangement(model, call, layer, shape, y):
    """perm with y.flatten() == layer_output.flatten()[perm] when the model's output only moves the layer's values
    (its output replaced by ids comes out a permutation of them), else None. The ids are half-integers on both sides
    of 0 (-n/2 + 0.5 … n/2 - 0.5): a leaky ReLU, an ELU or a rounding after the layer keeps 0..n-1 as they are and
    is no rearrangement (a review)."""
    import torch

    n = math.prod(shape)
    ids = (torch.arange(n, dtype=torch.float32, device=y.device) - (n / 2 - 0.5)).reshape(shape)
    handle = layer.register_forward_hook(lambda m, a, out: ids.to(out.dtype) if out.dtype == torch.float32 else None)
    try:
        with torch.no_grad():
            out = call(model)
    finally:
        handle.remove()
    from ...core.loss import primary_output

    moved = primary_output(out)[0]
    if not isinstance(moved, torch.Tensor) or moved.shape != y.shape or moved.dtype != torch.float32:
        return None
    perm = moved.detach().reshape(-1).to("cpu") + (n / 2 - 0.5)
    if not bool((perm == perm.round()).all()) or not bool((perm.sort().values == torch.arange(perm.numel())).all()):
        return None
    return perm.long()


def _inputs_per_row(layer) -> tuple[int, int] | None:
    """(inputs each output row is an affine function of, values per row) for a Linear or an ungrouped convolution."""
    import torch

    if isinstance(layer, torch.nn.Linear):
        return layer.in_features, layer.out_features
    if getattr(layer, "groups", 1) != 1 or getattr(layer, "transposed", False):
        return None
    return layer.in_channels * math.prod(layer.kernel_size), layer.out_channels
