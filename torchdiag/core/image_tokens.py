"""Default inputs of an hf: vision-language model that runs its image path: pixels beside token ids that hold
the image's placeholder tokens, as its processor writes them.

Such a model (LLaVA, Qwen2-VL, PaliGemma, ...) swaps each `image_token_id` in the ids for one image feature and
refuses a count that differs from the features its vision tower computes. That count depends on the tower,
its projector and the image size, so it is measured, not computed from the config: one forward with the ids
and pixels stops at the model's own `get_placeholder_mask(input_ids, inputs_embeds, image_features)` (the
method transformers' VLMs share; Idefics' `inputs_merger`), or at the `masked_scatter` into the mask it returned
(BLIP-2), and reads the features' numel() / the embedding width there. The ids are then rebuilt as N image
tokens followed by a short text. A model without those methods, or whose forward does not reach them with these
pixels, keeps its ids as they were (the probe then falls back to ids alone)."""
from __future__ import annotations

import inspect

SPEC = "image-tokens"   # the pseudo spec `image-tokens=token:ID` that asks for the rebuild (not an input)
TEXT_AFTER = 16         # text ids after the image's tokens
_KINDS = ("image", "video", "audio", "vision")
# the methods transformers' VLMs put image features into the embeddings with, and their features' names
METHODS = ("get_placeholder_mask", "inputs_merger")
FEATURES = ("image_features", "image_hidden_states")


class _Counted(Exception):
    """Stops the probe forward once the count is read."""


def token_of(config) -> int | None:
    """The config's image placeholder id (image_token_id, or image_token_index in older configs), else its video
    placeholder's (InstructBLIP-Video swaps `video_token_index` ids for the frames' query features)."""
    for key in ("image_token_id", "image_token_index", "video_token_id", "video_token_index"):
        value = getattr(config, key, None)
        if type(value) is int and value >= 0:
            return value
    return None


def count(model, inputs, ids=None, token: int | None = None) -> int | None:
    """Image features per sample the model computes for these inputs' pixels, or None when its forward does not
    reach a get_placeholder_mask (Idefics: inputs_merger) that is given them or whose mask it then fills
    (`masked_scatter`: BLIP-2's forward, which checks no count and leaves the image out when the ids hold no
    placeholder). With `ids` and `token`: also a mask the forward makes itself as `ids == token`
    (InstructBLIP-Video's), followed through its reshapes to the masked_scatter that fills it."""
    import torch
    from torch.overrides import TorchFunctionMode

    holders = [(m, name) for m in model.modules() for name in METHODS if callable(getattr(type(m), name, None))]
    found: list[int] = []
    # id of a mask -> (rows, embedding width): get_placeholder_mask's (its width known), or `ids == token` (None)
    masks: dict[int, tuple[int, int | None]] = {}
    keep: list = []   # the masks followed, alive: an id is not reused

    def capture(original):
        def wrapped(*args, **kwargs):
            try:
                bound = inspect.signature(original).bind(*args, **kwargs).arguments
            except TypeError:
                return original(*args, **kwargs)
            feats = next((bound[k] for k in FEATURES if k in bound), None)
            embeds = bound.get("inputs_embeds")
            if not (torch.is_tensor(embeds) and embeds.dim() >= 2 and embeds.shape[-1] > 0):
                return original(*args, **kwargs)
            if torch.is_tensor(feats):
                found.append(feats.numel() // embeds.shape[-1] // max(1, embeds.shape[0]))
                raise _Counted
            out = original(*args, **kwargs)
            for mask in out if isinstance(out, tuple) else (out,):
                if torch.is_tensor(mask):
                    masks[id(mask)] = embeds.shape[0], embeds.shape[-1]
            return out
        return wrapped

    class Fills(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is torch.Tensor.masked_scatter and len(args) == 3 and id(args[1]) in masks:
                rows, width = masks[id(args[1])]
                width = width or (args[0].shape[-1] if args[0].dim() else 0)
                if width:
                    found.append(args[2].numel() // width // max(1, rows))
                    raise _Counted
            out = func(*args, **kwargs)
            if args and torch.is_tensor(out) and out.dtype == torch.bool and _is_mask(func, args, ids, token, masks):
                masks[id(out)] = masks.get(id(args[0]), (ids.shape[0] if ids is not None else 1, None))
                keep.append(out)
            return out

    from .inputs import runs

    for m, name in holders:
        setattr(m, name, capture(getattr(m, name)))
    try:
        with Fills():
            runs(model, inputs, stop=_Counted)
    finally:
        for m, name in holders:
            m.__dict__.pop(name, None)
    return found[0] if found and found[0] > 0 else None


_FOLLOWED = ("unsqueeze", "to", "expand", "expand_as", "reshape", "view", "bool")


def _is_mask(func, args, ids, token, masks) -> bool:
    """Does this op make `ids == token`, or reshape a mask already followed?"""
    import torch

    if id(args[0]) in masks:
        return getattr(func, "__name__", "") in _FOLLOWED
    if ids is None or token is None or len(args) < 2 or func not in (torch.Tensor.__eq__, torch.Tensor.eq, torch.eq):
        return False
    from .inputs import same_data

    a, b = args[0], args[1]
    return torch.is_tensor(a) and same_data(a, ids) and not torch.is_tensor(b) and b == token


def rebuild(inputs, model, token: int) -> bool:
    """Replace the ids (inputs.args[0], else input_ids; batch x length) by each row's images, N placeholder tokens
    each with a text id after it, then TEXT_AFTER text ids; False (inputs unchanged) when the count cannot be read.
    The length is not checked against the config's position table: a rotary model runs past it, and the probe
    forward that follows finds out for one with a learned table. A forward that takes `mm_token_type_ids`
    (multimodal rotary positions) gets them: 1 at the image's tokens, 0 elsewhere."""
    import torch

    from .hf_inputs import forward_params

    positional = bool(inputs.args) and torch.is_tensor(inputs.args[0]) and not inputs.args[0].is_floating_point()
    ids = inputs.args[0] if positional else inputs.kwargs.get("input_ids")
    # on meta the model's own count check reads a value (transformers' VLMs): no image layout runs there anyway
    if not torch.is_tensor(ids) or ids.dim() != 2 or ids.device.type == "meta":
        return False
    n = count(model, inputs, ids, token)
    if n is None:
        return False
    rows, k = ids.shape[0], _images_per_row(inputs, ids.shape[0], n)
    text = _text(ids, TEXT_AFTER + k, model)
    reserved = _placeholders(getattr(model, "config", None)) | {token}
    for r in reserved:   # a random text id that is a placeholder would ask for features nobody gives
        text[text == r] = _free_id(reserved)
    image = torch.full((rows, n // k), token, dtype=ids.dtype, device=ids.device)
    # one block per image, a text id after each: a multimodal rotary position numbers each image's block apart
    parts = [p for i in range(k) for p in (image, text[:, i:i + 1])] + [text[:, k:]]
    ids = torch.cat(parts, 1)
    if positional:
        inputs.args = (ids,) + tuple(inputs.args[1:])
    else:
        inputs.kwargs["input_ids"] = ids
    if "mm_token_type_ids" in forward_params(type(model)):
        inputs.kwargs["mm_token_type_ids"] = ids.eq(token).long()
    inputs.notes.append(f"input[0]: {n} placeholder ids {token} per sequence ({k} image(s) or video(s)), one per "
                        f"image feature the model computes (as its processor writes them), then {TEXT_AFTER} text ids")
    return True


def _text(ids, length: int, model):
    """The text ids after the images: the first `length` of `ids`, or, for ids all alike (a keyword spec's zeros),
    ids drawn (seeded) in the range of the model's input embedding."""
    import torch

    text = ids[:, :length].clone()
    emb = model.get_input_embeddings() if callable(getattr(model, "get_input_embeddings", None)) else None
    rows = getattr(emb, "num_embeddings", None)
    if text.numel() and bool((text == text.flatten()[0]).all()) and isinstance(rows, int) and rows > 1:
        g = torch.Generator().manual_seed(0)
        text = torch.randint(0, rows, tuple(text.shape), generator=g, dtype=text.dtype).to(text.device)
    return text


def _images_per_row(inputs, rows: int, n: int) -> int:
    """Images per sequence: packed images (an `image_grid_thw` of one row per image) shared out over the rows."""
    grid = inputs.kwargs.get("image_grid_thw")
    images = int(grid.shape[0]) if grid is not None and grid.dim() == 2 else rows
    k = images // rows if images % rows == 0 and images >= rows else 1
    return k if n % k == 0 else 1


def _placeholders(config) -> set[int]:
    """Every image/video/audio placeholder id the config (or a sub-config) names."""
    out: set[int] = set()
    for c in (config, getattr(config, "text_config", None)):
        for key, value in (vars(c).items() if c is not None else ()):
            if type(value) is int and value >= 0 and key.endswith(("_token_id", "_token_index")) \
                    and any(k in key for k in _KINDS):
                out.add(value)
    return out


def _free_id(reserved: set[int]) -> int:
    return next(i for i in range(1, len(reserved) + 2) if i not in reserved)
