"""gradcam: where an image classifier looks (Grad-CAM, Selvaraju et al. 2017).

For the chosen layer's output A (N×C×h×w) and the class score y_k (logit, before softmax):
weights α_c = mean over h×w of ∂y_k/∂A_c; map = ReLU(Σ_c α_c A_c), bilinearly resized to the
input size and divided by its maximum (values in [0, 1]; an all-zero map stays zero and is
reported). The gradient is taken with torch.autograd.grad with respect to A only: the layer's
output is re-entered as a leaf in a forward hook, so no parameter .grad is written and frozen
models work; the model continues on a copy of that leaf, so in-place ops after the layer
(ReLU(inplace=True)) neither fail nor change A. A layer called several times is explained at its
last call. The image is read, resized (`size`) and normalised ((x/255 − mean)/std) as asked."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..core.device import widened
from ..core.guard import leave_no_trace
from ..core.layout import Producers, channels_last
from ..core.resources import memory_limit
from ..core.run import flag, number
from ..core.tracking import ModuleTracker, forward_error, module_named
from ..errors import ModelError, OptionError, UsageError, device_error, one_line
from ..pictures import PICTURE_MIN, gradcam_size, need_pictures
from ..results import Column, Result, Table

NEEDS_VALUES = True
TAKES_INPUTS = False          # the input is the image file
BYTES_PER_PIXEL = 200         # what one pixel of the (resized) image costs here: tensors, heatmap, pictures


@dataclass
class Options:
    layer: str = ""
    image: str = ""
    size: object = None                      # H, (H, W), "H" or "HxW"; becomes (h, w), None: the model's own input's (built_for), else the file's
    mean: object = None                      # one number per channel, one for all, or "0.485,0.456,0.406";
    std: object = None                       # None: the model's own (its weights' preprocessing), else 0 and 1
    channels: int = 3                        # 3: RGB; 1: grayscale (one mean/std)
    target_class: int | None = None
    out: bool = False                        # original | heatmap | overlay as one PNG (render/gradcam.py)
    tb: bool = False
    alpha: float = 0.5
    topk: int = 5
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        """The one check of the preprocessing options (CLI, Python and check alike), before the model loads."""
        if not self.layer or not isinstance(self.layer, str):
            raise OptionError("layer", "gradcam needs the layer to explain",
                              hint="the path of its last convolutional layer, as `torchdiag summary MODEL` lists it "
                                   "(torchvision's resnet18: layer4)")
        if not self.image:
            raise OptionError("image", "gradcam needs an image file",
                              hint="a PNG or JPEG; match the model's preprocessing with size, mean, std and channels")
        self.image = str(self.image)
        if self.channels not in (1, 3) or isinstance(self.channels, bool):
            raise OptionError("channels", f"{self.channels!r} is not 3 (RGB) or 1 (grayscale)")
        self.size = _size(self.size)
        self.mean = None if self.mean is None else _per_channel("mean", self.mean, self.channels)
        self.std = None if self.std is None else _per_channel("std", self.std, self.channels)
        if self.std is not None and any(v == 0 for v in self.std):
            raise OptionError("std", f"{_text(self.std)}: a standard deviation of 0 divides by zero")
        if self.target_class is not None:
            number("target_class", self.target_class, low=0, integer=True)
        number("alpha", self.alpha, low=0, high=1)
        number("topk", self.topk, low=1, integer=True)
        flag("out", self.out, "torchdiag.render.gradcam.write_out")
        flag("tb", self.tb, "torchdiag.render.tensorboard.write_result")
        self._check_memory()

    def _check_memory(self) -> None:
        """--size and the image file against the machine's memory, before any pixel is allocated."""
        from ..core.image_file import image_size

        if self.out or self.tb:   # PIL reads the image, matplotlib colours the map the pictures show
            need_pictures("writing Grad-CAM pictures")
        else:                     # the text report: only the image is read (a sweep: exit 2 asking for matplotlib)
            need_pictures("reading the image", libraries=("PIL",))
        limit = memory_limit()
        if self.size is not None:
            _fits("size", self.size, limit)
        h, w = image_size(self.image, limit)             # header only; a decompression bomb stops here
        if self.size is None:
            _fits("image", (h, w), limit)


def _text(values) -> str:
    return ",".join(f"{v:g}" for v in values)


def _size(value):
    """(h, w) from H, (H, W), "H" or "HxW" (positive integers); None stays None."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            dims = [int(p) for p in value.lower().split("x")]
        except ValueError:
            dims = []
    elif isinstance(value, int) and not isinstance(value, bool):
        dims = [value]
    elif isinstance(value, (list, tuple)) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        dims = list(value)
    else:
        dims = []
    dims = dims * 2 if len(dims) == 1 else dims
    if len(dims) != 2 or min(dims) < 1:
        raise OptionError("size", f"'{value}' is not H or HxW with positive integers", hint="e.g. 224 or 32x48")
    return tuple(dims)


def _per_channel(name: str, value, channels: int) -> tuple[float, ...]:
    """One number per channel from a list/tuple, a number or "a,b,c" text; one number is every channel's."""
    example = "0.485,0.456,0.406" if channels == 3 else "0.1307"
    need = "3 numbers (R,G,B)" if channels == 3 else "1 number (grayscale)"
    try:
        if isinstance(value, str):
            vals = tuple(float(v) for v in value.replace(" ", "").split(","))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            vals = (float(value),)
        else:
            vals = tuple(float(v) for v in value)
    except (TypeError, ValueError):
        raise OptionError(name, f"'{value}' is not {need}", hint=f"e.g. {example}") from None
    for v in vals:
        number(name, v)
    if len(vals) == 1:
        vals = vals * channels
    if len(vals) != channels:
        raise OptionError(name, f"'{value if isinstance(value, str) else _text(vals)}': need {need}, got {len(vals)}",
                          hint=f"e.g. {example}")
    return vals


def _fits(name: str, size, limit: int) -> None:
    h, w = size
    need = h * w * BYTES_PER_PIXEL
    if need > limit:
        what = "image too large: " if name == "image" else ""
        raise OptionError(name, f"{what}{h}x{w} pixels would take about {need / 2**30:.1f} GiB "
                          f"({limit / 2**30:.1f} GiB available)", hint="use a smaller size (size 224 is typical)")


def image_tensor(rgb, mean, std, device):
    """HxWxC uint8 → 1×C×H×W float32: (x/255 − mean)/std, one mean/std per channel."""
    import torch

    x = torch.from_numpy(rgb).permute(2, 0, 1).float().div(255.0)
    m = torch.tensor(mean, dtype=torch.float32).view(-1, 1, 1)
    s = torch.tensor(std, dtype=torch.float32).view(-1, 1, 1)
    return ((x - m) / s).unsqueeze(0).to(device)


def grad_cam(model, x, layer: str, target_class: int | None, info: dict | None = None, inputs=None):
    """(cam h×w at layer resolution (≥0, unnormalised), cam resized to x (normalised to [0,1]),
    logits, class used). Runs with the caller's guard around it. `info` (optional) gets
    "calls": how often the layer ran (the last call is explained). `inputs` (ModelInputs): the forward's
    inputs with the image among them, for a model that takes more than the image (other_inputs)."""
    import torch
    import torch.nn.functional as F

    module = model.get_submodule(layer)
    captured = {}

    def hook(mod, args, output):
        if not isinstance(output, torch.Tensor):
            raise UsageError(f"layer {layer} returns a {type(output).__name__}; Grad-CAM needs a tensor output")
        leaf = output.detach().requires_grad_(True)
        captured["a"], captured["producer"] = leaf, producers.of(args, mod, output)
        captured["calls"] = captured.get("calls", 0) + 1
        # the model continues on a non-leaf copy: an in-place op after the layer (ReLU(inplace=True)
        # in torchvision's VGG/ResNet) would fail on a leaf, and must not change A itself
        return leaf.clone()

    handle = module.register_forward_hook(hook)
    tracker = ModuleTracker(model, record_shapes=False)
    producers = Producers(model)
    try:
        with torch.enable_grad(), tracker, producers:
            try:
                out = inputs.call(model) if inputs is not None else model(x)
            except UsageError:
                raise
            except Exception as exc:
                err = forward_error(exc, tracker)
                err.hint = (f"the image goes in as {'x'.join(map(str, x.shape))} {str(x.dtype).replace('torch.', '')}; "
                            "match the model's input with --size H[xW], --channels 1|3, --mean/--std")
                raise err from exc
    finally:
        handle.remove()
    if "a" not in captured:
        raise UsageError(f"layer {layer} did not run in forward", hint="pick a module that the forward pass calls")
    from ..core.loss import primary_output

    logits, _ = primary_output(out)
    if logits.dim() != 2:
        raise UsageError(f"Grad-CAM needs (N, classes) scores; the model gave shape {tuple(logits.shape)}",
                         hint="a dense output (N, classes, H, W): explain one class over the pixels with a factory "
                              "that wraps the model to return model(x).mean((2, 3))" if logits.dim() == 4 else "")
    a = captured["a"]
    grid = token_grid(tuple(a.shape), tuple(x.shape[-2:]), model, module, captured.get("producer")) \
        if a.dim() == 3 else None
    if a.dim() != 4 and grid is None:
        raise UsageError(f"layer {layer} gives a {a.dim()}-D output of shape {tuple(a.shape)}; Grad-CAM needs N×C×H×W, "
                         "or a vision transformer's N×tokens×C with a patch grid of the image's aspect",
                         hint="choose a convolutional layer (the last conv block usually works best), or a transformer "
                              "block's output; `torchdiag attention` shows a transformer's attention maps")
    last = grid is not None or channels_last(tuple(a.shape), tuple(x.shape[-2:]), module, model,
                                             captured.get("producer"))
    k = int(logits[0].argmax()) if target_class is None else target_class
    if not 0 <= k < logits.shape[1]:
        raise OptionError("target_class", f"{k} is out of range: the model has {logits.shape[1]} classes")
    try:
        (grad,) = torch.autograd.grad(logits[0, k], a, allow_unused=True)
    except Exception as exc:
        raise (device_error(exc, "backward") or ModelError(f"backward from class {k} failed: {one_line(exc)}")) from exc
    if grad is None:
        grad = torch.zeros_like(a)
    act = a.detach()
    prefix_only = False
    if grid is not None:   # N×(k + h·w)×C tokens: the k class/register tokens left out, the rest the patch grid
        k_prefix, h, w = grid
        # after a ViT's last block only its class token reaches the head: the patches' gradient is exactly 0 there
        prefix_only = k_prefix > 0 and bool(grad[:, k_prefix:].eq(0).all() & grad[:, :k_prefix].ne(0).any())
        act, grad = (t[:, k_prefix:].reshape(t.shape[0], h, w, t.shape[2]) for t in (act, grad))
    if last:   # N×H×W×C (timm's Swin stages, a ViT's token grid): its channels are the last dimension
        act, grad = act.permute(0, 3, 1, 2), grad.permute(0, 3, 1, 2)
    weights = grad[0].mean(dim=(1, 2))                               # C
    cam = torch.relu((weights[:, None, None] * act[0]).sum(0))       # h×w
    up = F.interpolate(cam[None, None], size=tuple(x.shape[-2:]), mode="bilinear", align_corners=False)[0, 0]
    up = up.clamp_min(0)
    peak = float(up.max())
    norm = up / peak if peak > 0 else up
    if info is not None:
        info["calls"], info["channels_last"], info["tokens"] = captured["calls"], last and grid is None, grid
        info["prefix_only"] = prefix_only
    return cam.detach().cpu(), norm.detach().cpu(), logits.detach().cpu(), k


PREFIX_TOKENS = 8   # class, distillation and register tokens a vision transformer puts before its patches, at most


def token_grid(shape: tuple, image: tuple, model, module=None, producer=None) -> tuple[int, int, int] | None:
    """(k, h, w) when an N×L×C output reads as k ≤ PREFIX_TOKENS leading tokens and an h×w patch grid of the image's
    aspect (L = k + h·w) that the model's own patch embedding makes: a Conv2d whose kernel and stride are both the
    patch (H/h, W/w), as torchvision's and timm's ViTs cut the image; the CLS token first. Not without such a patch
    embedding (a review: a Conv1d's N×64×L read as an 8x8 grid, a transformer over an image's columns as 2 + 8x8
    tokens), nor where the layer (without parameters, the module that made its input) has a convolution's weight of
    as many output channels as the second size: N×C×L (a third review: a Conv1d beside a 4x4 stride-4 stem). The
    smallest k wins; None when no grid fits."""
    from torch import nn

    tokens, (height, width) = shape[1], image
    own = list(module.parameters()) if module is not None else []
    weights = own or (list(producer.parameters()) if producer is not None else [])
    # a Conv1d's (3-D weight) output channels are channels; a Conv2d's (4-D) are too where the width differs from them,
    # and where it equals them (N×64×64) the ViT reading stands (a fourth review: a ViT of 64 tokens, width 64)
    if any(w.shape[0] == tokens and (w.dim() == 3 or (w.dim() > 3 and shape[2] != tokens)) for w in weights):
        return None
    patches = {(tuple(m.kernel_size), tuple(m.stride)) for m in model.modules() if isinstance(m, nn.Conv2d)}
    for k in range(0, min(PREFIX_TOKENS, tokens - 1) + 1):
        n = tokens - k
        for h in range(1, n + 1):
            w = n // h
            if n % h or height % h or width % w:
                continue
            patch = (height // h, width // w)
            if (patch, patch) in patches:
                return k, h, w
    return None


def other_inputs(model, x, ctx, channels: int, given=False):
    """None for a model that takes the image alone. For one that takes more (an image and a timestep, an image and its
    metadata, pixel values beside token ids: a sweep's model raised), the model's own inputs (example_inputs(),
    example_input_array, an hf: spec's defaults) with the image in place of their one image tensor (N×C×H×W or
    N×H×W×C float, the image's C channels; positional or keyword) and every other input whose first size is the
    batch's cut to its first sample (a list of captions too), cast as --dtype casts. Used when those inputs hold more
    than one value, or the forward requires more than one; two image-like tensors (a mask beside the image), or none,
    or no such inputs: one clear line (a review: a mask first took the image's place, the map was wrong, exit 0)."""
    from ..core.precision import cast_inputs

    given = _own_inputs(model, ctx) if given is False else given
    needed = _required(model)
    many = given is not None and len(given.args) + len(given.kwargs) > 1
    if not many and len(needed) <= 1:
        return None
    takes = (f"the model's forward takes {len(needed)} inputs ({', '.join(needed)})" if len(needed) > 1 else
             f"the model's inputs are {given.describe() if given is not None else ''}")
    if given is None:
        raise UsageError(takes + "; Grad-CAM gives it the image alone, and no inputs for the others were given",
                         hint="define example_inputs() in the model's module (or example_input_array on the model): "
                              "the image takes the place of its image tensor")
    slots = [k for k, t in [*enumerate(given.args), *given.kwargs.items()] if _image_like(t, channels)]
    if len(slots) != 1:
        what = "hold no" if not slots else f"hold {len(slots)} ({', '.join(map(_slot_name, slots))}): Grad-CAM cannot " \
                                          "tell which is the"
        raise UsageError(f"{takes}, and they {what} N×{channels}×H×W image", hint="wrap the model so its forward takes "
                         "the image alone (the other inputs fixed inside), or give example_inputs() one image tensor")
    slot = slots[0]
    example = given.args[slot] if isinstance(slot, int) else given.kwargs[slot]
    batch = example.shape[0]
    image = x if example.shape[1] == channels else x.permute(0, 2, 3, 1)

    def first(v):
        if hasattr(v, "shape") and getattr(v, "dim", lambda: 0)() and v.shape[0] == batch:
            return v[:1]
        return v[:1] if isinstance(v, (list, tuple)) and len(v) == batch and batch > 1 else v

    args = tuple(image if i == slot else first(t) for i, t in enumerate(given.args))
    kwargs = {k: image if k == slot else first(v) for k, v in given.kwargs.items()}
    out = type(given)(args, kwargs, f"{given.source}, the image in {_slot_name(slot)}")
    return cast_inputs(out, ctx.spec.dtype)


def _own_inputs(model, ctx):
    """The model's own inputs: example_inputs(), example_input_array, an hf: spec's defaults (through the loader), or
    on a model given from Python, its example_input_array; None when it has none."""
    from ..core.inputs import ModelInputs, resolve_inputs

    if ctx.loaded is None:
        value = getattr(model, "example_input_array", None)
        if value is None:
            return None
        if isinstance(value, dict):
            return ModelInputs((), dict(value), "example_input_array").to(ctx.device)
        return ModelInputs(tuple(value) if isinstance(value, (list, tuple)) else (value,), {},
                           "example_input_array").to(ctx.device)
    try:
        return resolve_inputs([], ctx.loaded, ctx.device, ctx.spec.seed)
    except UsageError:
        return None


def _normalisation(opts: Options, ctx) -> tuple[tuple, tuple, str]:
    """(mean, std, where from): what was given, else the model's weights' own (a torchvision spec's transforms(), a
    timm spec's pretrained_cfg: the size was read from them, the normalisation was not, and an image fed to loaded
    weights at mean 0, std 1 is off their distribution: a new user's hour), else 0 and 1."""
    own = getattr(ctx.loaded, "normalisation", None) if ctx.loaded is not None else None
    if own is not None and len(own[0]) != opts.channels:   # said: a review found it dropped silently
        return ((0.0,) * opts.channels if opts.mean is None else opts.mean,
                (1.0,) * opts.channels if opts.std is None else opts.std,
                f" (the model's own, {own[2]}, is for {len(own[0])} channels: not used with --channels {opts.channels})")
    mean = opts.mean if opts.mean is not None else own[0] if own is not None else (0.0,) * opts.channels
    std = opts.std if opts.std is not None else own[1] if own is not None else (1.0,) * opts.channels
    taken = [name for name, given in (("mean", opts.mean), ("std", opts.std)) if given is None and own is not None]
    return mean, std, f" ({' and '.join(taken)}: the model's, {own[2]}; --mean/--std set others)" if taken else ""


def built_for(given, channels: int) -> tuple[int, int] | None:
    """(H, W) of the one image among the model's own inputs (`given`: a timm spec's pretrained_cfg input_size, an
    hf: config's image_size, example_inputs()): the size it is built for, which an image file of another size is
    resized to when --size is not given (a sweep: a 32x32 file fed as is gave seven timm and torchvision models a 1x1
    map told "after the global pooling", and two raised, exit 3)."""
    if given is None:
        return None
    images = [t for t in [*given.args, *given.kwargs.values()] if _image_like(t, channels)]
    if len(images) != 1:
        return None
    shape = tuple(images[0].shape)
    return (shape[2], shape[3]) if shape[1] == channels else (shape[1], shape[2])


def _clip_shape(own, channels: int) -> str | None:
    """"NxCxTxHxW" of the first clip among the model's own inputs when they hold clips or volumes (5-D and more) and
    no still image; None otherwise."""
    import torch

    if own is None:
        return None
    tensors = [t for t in [*own.args, *own.kwargs.values()] if isinstance(t, torch.Tensor) and t.is_floating_point()]
    clips = [t for t in tensors if t.dim() >= 5]
    if not clips or any(_image_like(t, channels) for t in tensors):
        return None
    return "x".join(str(n) for n in clips[0].shape)


def _refuse_clips(own, shape: str, why: str, exc: Exception | None = None) -> None:
    """A model of clips or volumes that does not take the still image (a sweep: torchvision's r3d_18, whose Conv3d read
    the 4-D image as an unbatched clip of one channel, was exit 3 blaming the model, with a hint no option could
    follow; a review: a one-channel scan model ran on it and gave scores of no batch)."""
    raise UsageError(f"gradcam maps a still image (N x C x H x W), and this model {why}; {own.source} gives it "
                     f"{shape} (a clip or a volume)", hint="run it on an image model, or on a 2-D backbone of this one") \
        from exc


def _takes_image(model, x, own) -> str | None:
    """Why a model whose own inputs are clips does not take the still image `x` (None: it does, as a frame-wise video
    model averaging a 2-D CNN's scores over frames does): its forward raises, or its scores are not (1, C) for the C
    its own input gives (a review: a 3-D scan model with a 1x1x1 head gave (5, 1) on the image, and -k 3 was told
    the model has 1 class). Two no-grad eval forwards, for such models only."""
    import torch

    from ..core.loss import primary_output

    with leave_no_trace(model), torch.no_grad():
        model.eval()
        try:
            mine, _ = primary_output(own.call(model))
        except Exception:   # the model's own input failing is not this check's to say
            return None
        try:
            got, _ = primary_output(model(x))
        except Exception as exc:
            return f"refused one ({one_line(exc)})"
    if not isinstance(mine, torch.Tensor) or not isinstance(got, torch.Tensor) or mine.dim() != 2:
        return None
    if got.dim() != 2 or got.shape[0] != 1 or got.shape[1] != mine.shape[1]:
        return (f"gives it scores of shape {tuple(got.shape)}, not (1, {mine.shape[1]}) as its own input's "
                f"{tuple(mine.shape)} say")
    return None


def _image_like(t, channels: int) -> bool:
    import torch

    return isinstance(t, torch.Tensor) and t.is_floating_point() and t.dim() == 4 and channels in (t.shape[1], t.shape[-1])


def _slot_name(slot) -> str:
    return f"input[{slot}]" if isinstance(slot, int) else slot


def _required(model) -> list[str]:
    """The forward's parameters that have no default (the ones a call must give)."""
    import inspect

    try:
        params = inspect.signature(model.forward).parameters.values()
    except (TypeError, ValueError):
        return []
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [p.name for p in params if p.kind in kinds and p.default is inspect.Parameter.empty]


def class_name(model, k: int) -> str | None:
    """The name the model gives class k: its config's id2label (the Hugging Face convention), if any."""
    labels = getattr(getattr(model, "config", None), "id2label", None)
    if isinstance(labels, dict):
        name = labels.get(k, labels.get(str(k)))
        return str(name) if name is not None else None
    return None


def run(model, inputs, opts: Options, ctx) -> Result:
    import torch

    from ..core.image_file import load_rgb

    module_named(model, opts.layer)
    c = opts.channels
    mean, std, norm_from = _normalisation(opts, ctx)
    own = _own_inputs(model, ctx)
    size = opts.size or built_for(own, c)
    pixels = load_rgb(opts.image, size, c)
    x = image_tensor(pixels, mean, std, ctx.device)
    if ctx.spec.dtype:   # --dtype: the model was cast; the image goes in as its float inputs would
        x = x.to(getattr(torch, ctx.spec.dtype))
    rgb = pixels if c == 3 else pixels.repeat(3, axis=2)       # pictures are always RGB
    result = Result("gradcam", header={"layer": opts.layer, "image": opts.image,
                                       "image_size": f"{rgb.shape[0]}x{rgb.shape[1]}" + (
                                           f" (the model's input size: {own.source}; --size sets another)"
                                           if opts.size is None and size is not None else ""),
                                       "channels": "RGB" if c == 3 else "grayscale",
                                       "normalisation": f"(x/255 - {list(mean)}) / {list(std)}" + norm_from,
                                       "mode": "eval; gradient of the class logit w.r.t. the layer output"})
    given = other_inputs(model, x, ctx, c, own)
    if given is not None:
        result.header.update(inputs=given.describe(), input_source=given.source)
    clip = _clip_shape(own, c) if given is None else None
    if clip is not None:
        why = _takes_image(model, x, own)
        if why:
            _refuse_clips(own, clip, why)
    with leave_no_trace(model):
        model.eval()
        info: dict = {}
        with ctx.autocast():   # --amp: the forward as it trains
            try:
                cam, heat, logits, k = grad_cam(model, x, opts.layer, opts.target_class, info, given)
            except (ModelError, UsageError) as exc:   # (with other inputs beside the clip, not tried before; an
                clip = _clip_shape(own, c)            # option's own refusal, -k 99, stays that: a review)
                if clip is not None and not isinstance(exc, OptionError):
                    _refuse_clips(own, clip, f"refused one ({str(exc).splitlines()[0] if str(exc) else one_line(exc)})",
                                  exc)
                raise
    cam, heat, logits = cam.float(), heat.float(), logits.float()   # numpy has no bfloat16
    probs = torch.softmax(widened(logits[0]), 0)
    top = torch.topk(probs, min(opts.topk, probs.numel()))
    shown = [int(c) for c in top.indices] + ([k] if k not in top.indices.tolist() else [])   # the explained one too
    rows = [{"class": c, "name": class_name(model, c), "logit": float(logits[0, c]), "probability": float(probs[c]),
             "_mark": "◀ explained" if c == k else ""} for c in shown]
    hm = heat.numpy()
    peak = divmod(int(hm.argmax()), hm.shape[1])
    cam_np = cam.numpy()
    cam_peak = divmod(int(cam_np.argmax()), cam_np.shape[1])
    # a 1x1 or constant map has no peak: its heatmap's "peak" was the resize's rounding noise (a new user's hour)
    flat = cam_np.size == 1 or float(cam_np.max()) == float(cam_np.min())
    result.data.update({
        "target_class": k, "target_chosen": "given" if opts.target_class is not None else "argmax",
        "score": float(logits[0, k]), "probability": float(probs[k]),
        "cam_shape": list(cam_np.shape), "cam_peak": None if flat else list(cam_peak),
        "heatmap_peak": None if flat else list(peak), "heatmap_mean": float(hm.mean()), "heatmap_max": float(hm.max()),
        "heatmap_min": float(hm.min()),
    })
    name = class_name(model, k)
    if name is not None:
        result.data["class_name"] = name
    result.data["layer_calls"] = info["calls"]
    if info["calls"] > 1:
        result.notes.append(f"layer {opts.layer} ran {info['calls']} times in forward; the map explains its last call")
    if info["channels_last"]:
        result.notes.append(f"layer {opts.layer}'s output is channels-last (N×H×W×C): read as such")
    if info["tokens"] is not None:
        k_prefix, h, w = info["tokens"]
        result.notes.append(f"layer {opts.layer}'s output is tokens: its last {h}×{w} read as the image's patch grid"
                            + (f", the first {k_prefix} (class or register tokens) left out" if k_prefix else ""))
    named = [Column("name", "name")] if any(r["name"] is not None for r in rows) else []
    result.tables.append(Table("top_classes", "Top classes", [Column("class", "class", "int")] + named + [
        Column("logit", "logit", "float"), Column("probability", "probability", "pct"), Column("_mark", "")], rows))
    if cam_np.size == 1:
        result.add("no-spatial-map", "warning", opts.layer, f"layer {opts.layer}'s map is 1×1: it has no spatial "
                   "information, and the heatmap is flat", "choose an earlier layer, before the global pooling")
    if info["prefix_only"]:
        result.add("empty-cam", "warning", opts.layer, f"the Grad-CAM map is zero everywhere for class {k}: from "
                   f"layer {opts.layer} the model reads only its first {info['tokens'][0]} token(s) (the patch tokens' "
                   "gradient is exactly 0)", hint="choose the block before it, whose patch tokens the last one's "
                   "attention still mixes into the class token")
    elif float(cam_np.max()) == 0.0:
        result.add("empty-cam", "warning", opts.layer,
                   f"the Grad-CAM map is zero everywhere for class {k}: no positive evidence at this layer",
                   hint="try another (usually the last) convolutional layer or another --target-class")
    # Pictures are enlarged by an integer factor (nearest) so the shorter side is ≥ PICTURE_MIN px;
    # render/gradcam.py draws them (original | heatmap | overlay) from the image and the heatmap.
    f = max(1, -(-PICTURE_MIN // min(hm.shape))) if min(hm.shape) < PICTURE_MIN else 1
    result.data["picture_scale"] = f
    if opts.tb or opts.out:
        result.artefacts.update(image=rgb, alpha=opts.alpha, tb=opts.tb, out=opts.out)
    if opts.out:
        result.data["out_size"] = list(gradcam_size(rgb.shape[0] * f, rgb.shape[1] * f))
    result.summary += [("Explained class", f"{k}{f' ({name})' if name is not None else ''} (logit {float(logits[0, k]):.4g}, p={float(probs[k]):.3f})"),
                       ("Heatmap peak", f"none: the map is flat ({hm.shape[0]}x{hm.shape[1]})" if flat else
                        f"row {peak[0]}, col {peak[1]} of {hm.shape[0]}x{hm.shape[1]}"),
                       ("Layer map", f"{cam_np.shape[0]}x{cam_np.shape[1]}" + ("" if flat else f", peak at {cam_peak}"))]
    result.artefacts["heatmap"] = hm  # H×W in [0, 1], for Python callers
    return result
