"""The floor a last layer's span leaves under torchdiag's own random target: an output that is its last Linear's or
Conv's output moved around (reshaped, permuted, pixel-shuffled) holds, per row of that layer, an affine function of
`h` inputs; with fewer inputs than outputs and more rows than inputs no trained model fits random rows, and the best
any can do is a rank-h fit. A sweep: transformers' masked-image-modelling heads (ViT, Swin: a 1x1 convolution from 32
or 192 channels to 192 or 768 values per patch, then PixelShuffle) levelled at 0.454 and 0.201 x the start, the SVD's
floor for their shapes, and were a false cannot-overfit."""
from __future__ import annotations

import math

MAX_WORK = 2e10     # n·C² of the Gram matrix: beyond, the floor is not asked
MAX_IDS = 1 << 24   # float32 holds integer ids exactly below this


def span_floor(model, call, y, t) -> dict | None:
    """{kind, floor, real} when `y` (the trained model's output, from `call(model)`) is a rearrangement of its last
    weighted layer's output and that layer's span cuts the random target `t`; else None. Two no-grad forwards."""
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
    if rank >= min(rows, width) or rows * width * width > MAX_WORK:
        return None
    flat = torch.empty(y.numel(), dtype=torch.float64, device="cpu")
    flat[perm] = t.detach().reshape(-1).to("cpu", torch.float64)
    conv = isinstance(layer, torch.nn.modules.conv._ConvNd)   # channels at dim 1; a Linear's features last
    target = (flat.reshape(shape).movedim(1, -1) if conv else flat).reshape(rows, width)
    if layer.bias is not None:   # the bias takes each column's mean; the rest is a rank-h fit (Eckart-Young)
        target = target - target.mean(0)
    eig = torch.linalg.eigvalsh(target.T @ target).clamp_min(0)   # ascending: σ² of the target's rows
    floor = float(eig[:width - h].sum()) / y.numel()
    what = "convolution" if conv else "Linear"
    return {"kind": f"the span of its last layer, {name} (a {what} of {h} inputs per output row: rank ≤ {rank} over "
                    f"{rows} rows of {width} values)",
            "floor": floor, "span": True,
            "real": "more detail in a row than the layer's inputs carry"}


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
    (its output replaced by ids 0..n-1 comes out a permutation of them), else None."""
    import torch

    ids = torch.arange(math.prod(shape), dtype=torch.float32, device=y.device).reshape(shape)
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
    perm = moved.detach().reshape(-1).to("cpu")
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
