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


class Standardised:
    """What the first weighted layer reads in train mode, per feature (dim 1: a tabular column, an image channel):
    its mean and std, and how well an affine map of the raw feature explains it (correlation, over the batch and
    any further dims). A model that opens with BatchNorm standardises its input itself, with the batch's statistics
    in training and their running averages after."""

    def __init__(self, name: str, means: list[float], stds: list[float], corrs: list[float]):
        self.name, self.means, self.stds, self.corrs = name, means, stds, corrs

    def holds(self, far_mean: float, far_std: tuple[float, float]) -> bool:
        return bool(self.means) and all(abs(m) <= far_mean for m in self.means) \
            and all(far_std[0] <= s <= far_std[1] for s in self.stds) and all(c >= AFFINE for c in self.corrs)

    def describe(self) -> str:
        lo, hi = min(self.stds), max(self.stds)
        return (f"its first weighted layer, {self.name or '(root)'}, reads per-feature means within "
                f"±{max(abs(m) for m in self.means):.3g} and stds {lo:.3g}–{hi:.3g} in training (each an affine "
                f"image of its raw feature: correlation ≥ {min(self.corrs):.3g})")


def standardised_in_training(work, inputs, ctx, raw_input) -> Standardised | None:
    """Standardised for the first weighted layer that reads a tensor of the raw input's shape, from one seeded
    train-mode forward of `work` (a copy: BatchNorm's running statistics move) under no_grad, read back once; None
    when no such layer runs first among the weighted ones, the input has one feature or one sample, or the forward
    raises."""
    import torch

    from .index_guard import guarded

    if raw_input.dim() < 2 or raw_input.shape[0] < 2 or raw_input.shape[1] < 1:
        return None
    raw = _per_feature(raw_input.detach().float().clone())
    names = {m: n for n, m in work.named_modules()}
    seen: list = []

    def pre(module, args, kwargs):
        if seen:
            return
        x = next((a for a in (*args, *kwargs.values()) if torch.is_tensor(a) and a.is_floating_point()), None)
        seen.append((module, x.detach().float().clone() if x is not None and x.shape == raw_input.shape else None))

    handles = [m.register_forward_pre_hook(pre, with_kwargs=True) for m in work.modules() if weighted(m)]
    try:
        work.train()
        with torch.no_grad(), ctx.seeded(), ctx.autocast(), guarded(work):
            inputs.call(work)
    except Exception:   # the other checks name it
        return None
    finally:
        for h in handles:
            h.remove()
    if not seen or seen[0][1] is None:
        return None
    x = _per_feature(seen[0][1])
    live = raw.std(1) > 0   # a constant raw feature has nothing to standardise (a constant column is its own finding)
    raw, x = raw[live], x[live]
    if not raw.shape[0]:
        return None
    rc, xc = raw - raw.mean(1, keepdim=True), x - x.mean(1, keepdim=True)
    corr = (rc * xc).sum(1) / (rc.norm(dim=1) * xc.norm(dim=1)).clamp_min(1e-30)
    means, stds, corrs = torch.stack([x.mean(1), x.std(1), corr]).to("cpu").tolist()
    return Standardised(names.get(seen[0][0], "?"), means, stds, corrs)


def _per_feature(t):
    """(features, values): dim 1 of (N, F, ...) as the feature, the batch and the rest as its values."""
    return t.transpose(0, 1).reshape(t.shape[1], -1)
