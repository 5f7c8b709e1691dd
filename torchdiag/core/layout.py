"""Which dimension of a layer's 4-D output holds the channels: N×C×H×W, or N×H×W×C (timm's Swin and ConvNeXt-style
stages). Shared by the commands that pool or map a layer's channels (gradcam, embeddings)."""
from __future__ import annotations

import math


def channels_last(shape: tuple, image: tuple) -> bool:
    """Is a 4-D layer output N×H×W×C? Its sizes 1-2 have the image's aspect (H, W) and sizes 2-3 do not (a sweep:
    Swin's 7×7×768 was read as a 7×768 map). N×C×H×W where both read alike."""
    def aspect(h: int, w: int) -> bool:
        return h > 0 and w > 0 and abs(math.log((h / w) / (image[0] / image[1]))) < 0.2

    # and its channels outnumber its height and width: a pooled N×C×H×W map of C ≈ H is not (a review's CRNN-like
    # 1×16×16×8 after MaxPool2d((2, 4)))
    return not aspect(shape[2], shape[3]) and aspect(shape[1], shape[2]) and shape[3] > max(shape[1], shape[2])
