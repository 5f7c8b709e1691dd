"""Which dimension of a layer's 4-D output holds the channels: N×C×H×W, or N×H×W×C (timm's Swin and ConvNeXt-style
stages). Shared by the commands that pool or map a layer's channels (gradcam, embeddings)."""
from __future__ import annotations

import math


def channels_last(shape: tuple, image: tuple, module=None, model=None) -> bool:
    """Is a 4-D layer output N×H×W×C? Its sizes 1-2 have the image's aspect (H, W), sizes 2-3 do not, and its last
    outnumbers its height and width (a sweep: Swin's 7×7×768 was read as a 7×768 map), unless the layer's parameters
    (the model's, for a layer without any) hold its second size and not its last: a convolution's channels (a review:
    two 64-channel views side by side, N×64×56×112). The aspect decides first: a block that concatenates branches
    holds no parameter of its own width, and may hold one of its height (a review: GoogLeNet's 256×32×32 inception
    output, GhostNet's 120×24×40, read as channels last when the parameters decided first)."""
    def aspect(h: int, w: int) -> bool:
        return h > 0 and w > 0 and abs(math.log((h / w) / (image[0] / image[1]))) < 0.2

    # its channels outnumber its height and width: a pooled N×C×H×W map of C ≈ H is not (a review's CRNN-like
    # 1×16×16×8 after MaxPool2d((2, 4)))
    if aspect(shape[2], shape[3]) or not aspect(shape[1], shape[2]) or shape[3] <= max(shape[1], shape[2]):
        return False
    sizes = _param_sizes(module) or _param_sizes(model)   # a layer without parameters (an Identity): the model's
    return not (shape[1] in sizes and shape[3] not in sizes)


def _param_sizes(module) -> set[int]:
    """Every dimension of every parameter of `module` (none without one)."""
    if module is None:
        return set()
    return {int(d) for p in module.parameters() for d in p.shape}
