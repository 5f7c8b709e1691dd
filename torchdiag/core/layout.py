"""Which dimension of a layer's 4-D output holds the channels: N×C×H×W, or N×H×W×C (timm's Swin and ConvNeXt-style
stages). Shared by the commands that pool or map a layer's channels (gradcam, embeddings)."""
from __future__ import annotations

import math
import weakref


def channels_last(shape: tuple, image: tuple, module=None, model=None, producer=None) -> bool:
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
      N×C×H×W.
    `producer`: the module that made the layer's input (Producers.of): its parameters holding the second size and not
    the last veto channels last too (a sweep: a ReLU after a stride-(2, 1) convolution of 8
    channels, 8×16×64, in a model holding both 8 and 64). It only vetoes: a Linear mixing along the width holds the
    width and not the channels (a review: MLP-Mixer-style, read as channels last when it decided)."""
    def aspect(h: int, w: int) -> bool:
        return h > 0 and w > 0 and abs(math.log((h / w) / (image[0] / image[1]))) < 0.2

    last, second = aspect(shape[1], shape[2]), aspect(shape[2], shape[3])
    if second and not last:
        return False
    sizes = _param_sizes(module) or _param_sizes(model)   # a layer without parameters (an Identity): the model's
    says_last, says_first = shape[3] in sizes and shape[1] not in sizes, shape[1] in sizes and shape[3] not in sizes
    made = _param_sizes(producer)
    says_first = says_first or (shape[1] in made and shape[3] not in made)
    says_last = says_last and not says_first
    if last and not second:
        # (≥: a last size equal to the height is a tie only the aspect breaks: edgenext's 24×16×24 at 96×64, a review)
        return not says_first and (shape[3] >= max(shape[1], shape[2]) or says_last)
    return says_last


def _param_sizes(module) -> set[int]:
    """Every dimension of every parameter of `module` (none without one)."""
    if module is None:
        return set()
    return {int(d) for p in module.parameters() for d in p.shape}


class Producers:
    """Which module with parameters of its own made a tensor, recorded over one forward (a hook on each such module):
    a layer without parameters is read by the module that made its input, not by the whole model's parameters (a
    sweep: a ReLU after a stride-(2, 1) convolution of 8 channels, 8×16×64 from a 32×64 image, in a model holding
    both 8 and 64, was read as channels last). Used as a context manager around the forward."""

    def __init__(self, model):
        self.model, self.made, self.handles = model, {}, []

    def __enter__(self):
        for m in self.model.modules():
            if any(True for _ in m.parameters(recurse=False)):
                self.handles.append(m.register_forward_hook(self._hook))
        return self

    def __exit__(self, *exc):
        for h in self.handles:
            h.remove()
        self.handles = []

    def _hook(self, mod, args, out) -> None:
        import torch

        if isinstance(out, torch.Tensor):
            self.made[id(out)] = (weakref.ref(out), mod)

    def of(self, args, layer=None, out=None):
        """The module that made the first tensor of `args` (a layer's inputs, asked while they are alive), or None.
        For a `layer` with parameters, only where its output keeps that tensor's last size (a width-mixing Linear): a
        layer that makes new channels (Swin's fc1, 16 -> 64) is not told by what its input held (a review: its
        LayerNorm held 16, the height too, and vetoed)."""
        import torch

        first = next((a for a in args if isinstance(a, torch.Tensor)), None)
        got = self.made.get(id(first)) if first is not None else None
        if got is None or got[0]() is not first:
            return None
        if layer is not None and any(True for _ in layer.parameters()) and (
                not isinstance(out, torch.Tensor) or first.dim() == 0 or out.dim() == 0 or first.shape[-1] != out.shape[-1]):
            return None
        return got[1]
