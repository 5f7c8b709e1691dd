"""Which dimension of a layer's 4-D output holds the channels: N×C×H×W, or N×H×W×C (timm's Swin and ConvNeXt-style
stages). Shared by the commands that pool or map a layer's channels (gradcam, embeddings)."""
from __future__ import annotations

import math


def channels_last(shape: tuple, image: tuple, module=None, model=None) -> bool:
    """Is a 4-D layer output N×H×W×C? Read from the image's aspect (H, W) first, then from the layer's parameters (the
    model's, for a layer without any), which hold a layer's channel count:
    - sizes 2-3 have the aspect and sizes 1-2 do not: N×C×H×W. A block that concatenates branches holds no parameter
      of its own width, and may hold one of its height (a review: GoogLeNet's 256×32×32 inception output, GhostNet's
      120×24×40, read as channels last when the parameters decided first);
    - sizes 1-2 have it and 2-3 do not: N×H×W×C, unless the parameters hold its second size and not its last (a
      review: two 64-channel views side by side, N×64×56×112), and where its last is not the largest (a pooled
      CRNN-like 16×16×8 map: a review), only when the parameters hold its last size and not its second (a third
      review: Swin's first stage at 448, 112×112×96, and maxvit's 96×96×64 were read as N×C×H×W);
    - both or neither (a square map of as many channels as rows): the parameters decide where they tell, else
      N×C×H×W."""
    def aspect(h: int, w: int) -> bool:
        return h > 0 and w > 0 and abs(math.log((h / w) / (image[0] / image[1]))) < 0.2

    last, second = aspect(shape[1], shape[2]), aspect(shape[2], shape[3])
    if second and not last:
        return False
    sizes = _param_sizes(module) or _param_sizes(model)   # a layer without parameters (an Identity): the model's
    says_last, says_first = shape[3] in sizes and shape[1] not in sizes, shape[1] in sizes and shape[3] not in sizes
    if last and not second:
        return not says_first and (shape[3] > max(shape[1], shape[2]) or says_last)
    return says_last


def _param_sizes(module) -> set[int]:
    """Every dimension of every parameter of `module` (none without one)."""
    if module is None:
        return set()
    return {int(d) for p in module.parameters() for d in p.shape}
