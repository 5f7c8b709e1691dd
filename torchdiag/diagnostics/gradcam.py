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

from ..core.guard import leave_no_trace
from ..core.tracking import ModuleTracker, forward_error
from ..errors import ModelError, UsageError
from ..results import Column, Result, Table


PICTURE_MIN = 128


@dataclass
class Options:
    layer: str = ""
    image: str = ""
    size: tuple[int, int] | None = None      # (h, w); None keeps the file's size
    mean: tuple[float, ...] = (0.0, 0.0, 0.0)
    std: tuple[float, ...] = (1.0, 1.0, 1.0)
    channels: int = 3                        # 3: RGB; 1: grayscale (one mean/std)
    target_class: int | None = None
    out: str | None = None
    tb: bool = False
    alpha: float = 0.5
    topk: int = 5
    extra: dict = field(default_factory=dict)


def image_tensor(rgb, mean, std, device):
    """HxWxC uint8 → 1×C×H×W float32: (x/255 − mean)/std, one mean/std per channel."""
    import torch

    x = torch.from_numpy(rgb).permute(2, 0, 1).float().div(255.0)
    m = torch.tensor(mean, dtype=torch.float32).view(-1, 1, 1)
    s = torch.tensor(std, dtype=torch.float32).view(-1, 1, 1)
    return ((x - m) / s).unsqueeze(0).to(device)


def grad_cam(model, x, layer: str, target_class: int | None, info: dict | None = None):
    """(cam h×w at layer resolution (≥0, unnormalised), cam resized to x (normalised to [0,1]),
    logits, class used). Runs with the caller's guard around it. `info` (optional) gets
    "calls": how often the layer ran (the last call is explained)."""
    import torch
    import torch.nn.functional as F

    module = model.get_submodule(layer)
    captured = {}

    def hook(mod, args, output):
        if not isinstance(output, torch.Tensor):
            raise UsageError(f"layer {layer} returns a {type(output).__name__}; Grad-CAM needs a tensor output")
        leaf = output.detach().requires_grad_(True)
        captured["a"] = leaf
        captured["calls"] = captured.get("calls", 0) + 1
        # the model continues on a non-leaf copy: an in-place op after the layer (ReLU(inplace=True)
        # in torchvision's VGG/ResNet) would fail on a leaf, and must not change A itself
        return leaf.clone()

    handle = module.register_forward_hook(hook)
    tracker = ModuleTracker(model, record_shapes=False)
    try:
        with torch.enable_grad(), tracker:
            try:
                out = model(x)
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
        raise UsageError(f"Grad-CAM needs (N, classes) scores; the model gave shape {tuple(logits.shape)}")
    a = captured["a"]
    if a.dim() != 4:
        raise UsageError(f"layer {layer} gives a {a.dim()}-D output of shape {tuple(a.shape)}; Grad-CAM needs N×C×H×W",
                         hint="choose a convolutional layer (the last conv block usually works best)")
    k = int(logits[0].argmax()) if target_class is None else target_class
    if not 0 <= k < logits.shape[1]:
        raise UsageError(f"--target-class {k} is out of range: the model has {logits.shape[1]} classes")
    try:
        (grad,) = torch.autograd.grad(logits[0, k], a, allow_unused=True)
    except Exception as exc:
        raise ModelError(f"backward from class {k} failed: {exc}") from exc
    if grad is None:
        grad = torch.zeros_like(a)
    weights = grad[0].mean(dim=(1, 2))                               # C
    cam = torch.relu((weights[:, None, None] * a[0].detach()).sum(0))  # h×w
    up = F.interpolate(cam[None, None], size=tuple(x.shape[-2:]), mode="bilinear", align_corners=False)[0, 0]
    up = up.clamp_min(0)
    peak = float(up.max())
    norm = up / peak if peak > 0 else up
    if info is not None:
        info["calls"] = captured["calls"]
    return cam.detach().cpu(), norm.detach().cpu(), logits.detach().cpu(), k


def run(model, device, opts: Options) -> Result:
    import torch

    from ..render import images as im

    if not opts.layer:
        raise UsageError("gradcam needs --layer NAME", hint="the last convolutional layer, e.g. --layer features.3")
    if getattr(device, "type", device) == "meta" or \
            any(t.device.type == "meta" for t in list(model.parameters()) + list(model.buffers())):
        raise UsageError("gradcam needs real values; the meta device has none", hint="use --device cpu or cuda")
    names = dict(model.named_modules())
    if opts.layer not in names:
        import difflib

        close = difflib.get_close_matches(opts.layer, [n for n in names if n], n=3, cutoff=0.5)
        raise UsageError(f"no module named '{opts.layer}' in the model",
                         hint=(f"did you mean {', '.join(close)}?" if close else "module paths are listed by `torchdiag summary`"))
    c = opts.channels
    if c not in (1, 3):
        raise UsageError(f"--channels {c}: an image has 3 (RGB) or 1 (grayscale)")
    mean = tuple(opts.mean) * c if len(opts.mean) == 1 else tuple(opts.mean)
    std = tuple(opts.std) * c if len(opts.std) == 1 else tuple(opts.std)
    if len(mean) != c or len(std) != c or any(s == 0 for s in std):
        raise UsageError(f"--mean and --std take {'three numbers (R,G,B)' if c == 3 else 'one number (grayscale)'}; "
                         "std must not be 0")
    pixels = im.load_rgb(opts.image, opts.size, c)
    x = image_tensor(pixels, mean, std, device)
    rgb = pixels if c == 3 else pixels.repeat(3, axis=2)       # pictures are always RGB
    result = Result("gradcam", header={"layer": opts.layer, "image": opts.image,
                                       "image_size": f"{rgb.shape[0]}x{rgb.shape[1]}",
                                       "channels": "RGB" if c == 3 else "grayscale",
                                       "normalisation": f"(x/255 - {list(mean)}) / {list(std)}",
                                       "mode": "eval; gradient of the class logit w.r.t. the layer output"})
    with leave_no_trace(model):
        model.eval()
        info: dict = {}
        cam, heat, logits, k = grad_cam(model, x, opts.layer, opts.target_class, info)
    probs = torch.softmax(logits[0].double(), 0)
    top = torch.topk(probs, min(opts.topk, probs.numel()))
    rows = [{"class": int(c), "logit": float(logits[0, c]), "probability": float(p),
             "_mark": "◀ explained" if int(c) == k else ""} for p, c in zip(top.values, top.indices)]
    hm = heat.numpy()
    peak = divmod(int(hm.argmax()), hm.shape[1])
    cam_np = cam.numpy()
    cam_peak = divmod(int(cam_np.argmax()), cam_np.shape[1])
    result.data.update({
        "target_class": k, "target_chosen": "given" if opts.target_class is not None else "argmax",
        "score": float(logits[0, k]), "probability": float(probs[k]),
        "cam_shape": list(cam_np.shape), "cam_peak": list(cam_peak),
        "heatmap_peak": list(peak), "heatmap_mean": float(hm.mean()), "heatmap_max": float(hm.max()),
        "heatmap_min": float(hm.min()),
    })
    result.data["layer_calls"] = info["calls"]
    if info["calls"] > 1:
        result.notes.append(f"layer {opts.layer} ran {info['calls']} times in forward; the map explains its last call")
    result.tables.append(Table("top_classes", "Top classes", [
        Column("class", "class", "int"), Column("logit", "logit", "float"), Column("probability", "probability", "pct"),
        Column("_mark", "")], rows))
    if float(cam_np.max()) == 0.0:
        result.add("empty-cam", "warning", opts.layer,
                   f"the Grad-CAM map is zero everywhere for class {k}: no positive evidence at this layer",
                   hint="try another (usually the last) convolutional layer or another --target-class")
    # Pictures are enlarged by an integer factor (nearest) so the shorter side is ≥ 128 px.
    f = max(1, -(-PICTURE_MIN // min(hm.shape))) if min(hm.shape) < PICTURE_MIN else 1
    original = im.upscale(rgb, f)
    heat_rgb = im.upscale(im.colorize(hm, "jet"), f)
    blended = im.upscale(im.overlay(rgb, hm, opts.alpha), f)
    result.data["picture_scale"] = f
    if opts.tb:
        result.images.update({"gradcam/original": original, "gradcam/heatmap": heat_rgb, "gradcam/overlay": blended})
    if opts.out:
        panel = im.hstack([original, heat_rgb, blended])
        path = im.save_png(panel, opts.out)
        result.data["out"] = str(path)
        result.data["out_size"] = [int(panel.shape[0]), int(panel.shape[1])]
        result.summary.append(("Picture", f"{path} (original | heatmap | overlay, {panel.shape[1]}x{panel.shape[0]} px)"))
    result.summary += [("Explained class", f"{k} (logit {float(logits[0, k]):.4g}, p={float(probs[k]):.3f})"),
                       ("Heatmap peak", f"row {peak[0]}, col {peak[1]} of {hm.shape[0]}x{hm.shape[1]}"),
                       ("Layer map", f"{cam_np.shape[0]}x{cam_np.shape[1]}, peak at {cam_peak}")]
    result._heatmap = hm  # for tests and callers in-process
    return result
