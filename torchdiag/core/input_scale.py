"""Does the model scale its input itself? What the first weighted layers receive, measured in one eval forward:
doctor's `unnormalised-input` and data's `raw-pixels` are info, not a warning, when the model rescales a raw-pixel
input before any weighted layer reads it (a `x / 255 - 0.5` Lambda, a per-channel Normalize inside the model)."""
from __future__ import annotations

SCALED = 5.0   # a weighted layer seeing |x| ≤ this: the input was scaled (normalised data spans a few std)
UNIT = 0.1     # ... and the first one at least this: scaled to a unit range, not squashed towards zero (x / 1e4)
AFFINE = 0.99  # the first one's input correlates with the raw input at least this much: scaled, not squashed


def weighted(module) -> bool:
    """A module holding a parameter of ≥ 2 dims of its own: a matmul or a convolution, whose output's scale follows
    its input's."""
    return any(p.dim() >= 2 for p in module.parameters(recurse=False))


class Seen:
    """What the weighted layers (modules holding a parameter of ≥ 2 dims: a matmul or a convolution, whose output's
    scale follows its input's) received with the raw input's number of values, at their first call, in call order:
    (module, largest |x|, correlation with the raw input). Scaled: every such layer sees |x| ≤ SCALED, the first one
    at least UNIT at its largest and an affine image of the input (correlation ≥ AFFINE: x / 255 - 0.5 or a
    per-channel Normalize, not a squashing tanh or clamp, not another tensor of the same size, not a constant)."""

    def __init__(self, layers: list[tuple[str, float, float]]):
        self.layers = layers

    def scaled(self) -> bool:
        return bool(self.layers) and all(m <= SCALED for _, m, _ in self.layers) and self.layers[0][1] >= UNIT \
            and self.layers[0][2] >= AFFINE

    def describe(self) -> str:
        name, most, corr = self.layers[0]
        raw = [n for n, m, _ in self.layers if m > SCALED]
        first = f"its first weighted layer, {name or '(root)'}, sees |x| ≤ {most:.4g} (correlation {corr:.3g} with the input)"
        return first + (f"; {raw[0] or '(root)'} sees the raw range" if raw and raw[0] != name else "")


def weighted_inputs(work, inputs, ctx, image) -> Seen | None:
    """Seen, from one eval forward under no_grad (one read at the end): the weighted layers' first inputs of
    `image`'s number of values; None when the forward raises (its error comes later)."""
    import torch

    from .index_guard import guarded

    raw = image.detach().reshape(-1).float().clone()   # before a forward that might edit the input in place
    layers_in = {m for m in work.modules() if weighted(m)}
    names = {m: n for n, m in work.named_modules()}
    layers: dict = {}

    def pre(module, args, kwargs):
        if module in layers:
            return
        vals = [a for a in (*args, *kwargs.values()) if torch.is_tensor(a) and a.is_floating_point()]
        x = next((a for a in vals if a.numel() == raw.numel()), None)
        if x is not None:
            v = x.detach().reshape(-1).float()
            corr = torch.corrcoef(torch.stack([raw.to(v.device), v]))[0, 1]
            layers[module] = torch.stack([v.abs().amax(), torch.nan_to_num(corr, nan=0.0)])

    handles = [m.register_forward_pre_hook(pre, with_kwargs=True) for m in layers_in]
    try:
        work.eval()
        with torch.no_grad(), ctx.autocast(), guarded(work):   # a GPU assert here would end the run
            inputs.call(work)
    except Exception:   # the eval forward below names it
        return None
    finally:
        for h in handles:
            h.remove()
    if not layers:
        return Seen([])
    read = torch.stack([t.to(raw.device) for t in layers.values()]).tolist()
    return Seen([(names.get(m, "?"), most, corr) for m, (most, corr) in zip(layers, read)])


def image_like(t) -> bool:
    if t.dim() == 4:
        return t.shape[1] in (1, 3, 4) or t.shape[-1] in (1, 3, 4)
    if t.dim() == 3:
        return t.shape[0] in (1, 3, 4) and min(t.shape[1:]) >= 8
    return False


class Standardising:
    """Whether standardising the input first changes what the model computes in training: its outputs on one batch
    with the input as given and standardised per feature (dim 1: a column, an image's channel; for other shapes also
    the last dim, a sequence's features), in seeded train-mode forwards of one copy. Per feature covers a Normalize
    of the whole input (one shift and scale for all), which a BatchNorm's eps would blur on features far smaller
    than the largest (wine's 0.06-std column under a whole-input scale of 215). A model that opens with BatchNorm (its batch statistics in training,
    their running averages after) computes the same; one whose any layer reads the raw values does not."""

    def __init__(self, change: float):
        self.change = change    # the largest output difference, as a share of the output's largest magnitude

    def holds(self) -> bool:
        return self.change <= INVARIANT   # (NaN: not)

    def describe(self) -> str:
        return (f"standardising it per feature first changes the model's training-mode output on the first batch by at "
                f"most {self.change:.2g} of its largest value")


INVARIANT = 1e-2   # BatchNorm's eps moves a standardised input's output by ~eps/2 (5e-4 at Keras' 1e-3)


def standardising_changes(work, inputs, ctx, raw_input) -> Standardising | None:
    """Standardising for `raw_input` (the call's only float input) on `work` (a copy: BatchNorm's running statistics
    move); None when the input has fewer than 2 samples, the forwards raise, the output has no float values, or it
    does not change with the input."""
    import torch

    from .index_guard import guarded

    if raw_input.dim() < 2 or raw_input.shape[0] < 2:
        return None
    x = raw_input.detach().float()
    # per feature: dim 1 (a table's column, an (N, C, H, W) image's channel); for other shapes, a sequence's
    # (N, T, F) among them, the last dim too
    features = [1] if x.dim() in (2, 4) else [1, x.dim() - 1]
    ways = [_standardise(x, [d for d in range(x.dim()) if d != f]) for f in features]
    outs = []
    try:
        work.train()
        # the raw input a clone: a forward may edit its input in place; last, its samples in reverse order, which
        # must change the output (a model that ignores its input computes the same whatever it is given)
        for t in (raw_input.detach().clone(), *ways, x.flip(0)):
            t = t.to(raw_input.dtype)
            swapped = inputs.map(lambda a, t=t: t if a is raw_input else a)
            with torch.no_grad(), ctx.seeded(), ctx.autocast(), guarded(work):
                outs.append(_floats(swapped.call(work)))
    except Exception:   # the other checks name it
        return None
    if not outs[0].numel() or any(o.shape != outs[0].shape for o in outs):
        return None
    *outs, reversed_ = outs
    scale = outs[0].abs().amax().clamp_min(1e-12)
    moved, change = torch.stack([(reversed_ - outs[0]).abs().amax() / scale,
                                 torch.stack([(o - outs[0]).abs().amax() for o in outs[1:]]).amax() / scale]).tolist()
    return Standardising(change) if moved > INVARIANT else None


def _standardise(x, dims: list[int]):
    return (x - x.mean(dims, keepdim=True)) / x.std(dims, keepdim=True).clamp_min(1e-12)


def _floats(out):
    import torch
    from torch.utils._pytree import tree_flatten

    ts = [t.detach().float().reshape(-1) for t in tree_flatten(out)[0] if torch.is_tensor(t) and t.is_floating_point()]
    return torch.cat(ts) if ts else torch.zeros(0)
