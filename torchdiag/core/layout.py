"""Which dimension of a layer's 4-D output holds the channels: N×C×H×W, or N×H×W×C (timm's Swin and ConvNeXt-style
stages). Shared by the commands that pool or map a layer's channels (gradcam, embeddings)."""
from __future__ import annotations

import math


def channels_last(shape: tuple, image: tuple, module=None, model=None) -> bool:
    """Is a 4-D layer output N×H×W×C? The layer's own parameters say so first: their sizes hold the channel count and
    not the spatial sizes (a Swin stage's 768, never its 7×7; a convolution's 64 out-channels, never 56 or 112). Where
    they cannot tell (both sizes among them; the model's, for a layer without parameters), its sizes 1-2 have the image's aspect (H, W) and sizes
    2-3 do not (a sweep: Swin's 7×7×768 was read as a 7×768 map). N×C×H×W where both read alike (a review: two views
    side by side, N×64×56×112, read as channels last by the aspect alone)."""
    sizes = _param_sizes(module) or _param_sizes(model)   # a layer without parameters (an Identity): the model's
    if (shape[3] in sizes) != (shape[1] in sizes):
        return shape[3] in sizes

    def aspect(h: int, w: int) -> bool:
        return h > 0 and w > 0 and abs(math.log((h / w) / (image[0] / image[1]))) < 0.2

    # and its channels outnumber its height and width: a pooled N×C×H×W map of C ≈ H is not (a review's CRNN-like
    # 1×16×16×8 after MaxPool2d((2, 4)))
    return not aspect(shape[2], shape[3]) and aspect(shape[1], shape[2]) and shape[3] > max(shape[1], shape[2])


def _param_sizes(module) -> set[int]:
    """Every dimension of every parameter of `module` (none without one)."""
    if module is None:
        return set()
    return {int(d) for p in module.parameters() for d in p.shape}
