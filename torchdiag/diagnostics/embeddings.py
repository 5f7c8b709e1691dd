"""embeddings: a layer's outputs for the batch, for TensorBoard's projector (PCA / t-SNE / UMAP).

One forward pass (eval, no grad); a forward hook keeps the layer's first tensor output. Each
sample becomes one vector: N×D as is; N×L×D (tokens) reduced over L (`mean`, `first` = CLS
token, or `flatten`); N×C×H×W reduced by global average pooling (`mean`) or `flatten`.
The vectors, labels and sprite (the input images when the inputs are N×{1,3}×H×W) are data in
`result.artefacts`; render/embeddings.py writes them with SummaryWriter.add_embedding under
DIR/embeddings/ (tensors.tsv, metadata.tsv when labels exist, sprite.png, projector_config.pbtxt).
Labels come from the target of a --batch function (`labels=` in Python). With labels, the
fraction of samples whose nearest neighbour (cosine) has the same label is reported."""
from __future__ import annotations

from dataclasses import dataclass

from ..core.guard import leave_no_trace
from ..core.layout import Producers, channels_last
from ..core.run import choice, flag
from ..core.tracking import ModuleTracker, first_tensor, forward_error, module_named
from ..errors import OptionError, UsageError
from ..results import Column, Result, Table

REDUCTIONS = ("auto", "mean", "first", "flatten")
NEEDS_VALUES = True


@dataclass
class Options:
    layer: str = ""
    reduce: str = "auto"
    labels: object = None        # N labels (a list; a tensor/array is taken as .tolist()), or None: the batch target
    sprite: bool = True
    images: bool = False         # the PCA preview (its coordinates: result.artefacts["pca_coords"])

    def __post_init__(self):
        if not self.layer or not isinstance(self.layer, str):
            raise OptionError("layer", "embeddings needs the module whose output is the embedding",
                              hint="the path of the module whose output you want to see, as `torchdiag summary MODEL` "
                                   "lists it (torchvision's resnet18: avgpool)")
        self.reduce = choice("reduce", self.reduce, REDUCTIONS)
        if hasattr(self.labels, "tolist"):     # a tensor or array, kept torch-free
            self.labels = self.labels.tolist()
        if self.labels is not None and not isinstance(self.labels, (list, tuple)):
            raise OptionError("labels", f"takes one label per sample (a list or tensor), not {type(self.labels).__name__}")
        flag("images", self.images, "torchdiag.render.embeddings.write_images")
        flag("sprite", self.sprite, "torchdiag.render.embeddings.write_projector")


def _batch_first(raw, n: int | None):
    """A sequence-first layer's L×N×D output (nn.MultiheadAttention, batch_first=False) as N×L×D: its leading size is
    not the batch's and its second is (a sweep: 6 per-position means over the batch were written as 6 samples)."""
    if n is not None and raw.dim() == 3 and raw.shape[0] != n and raw.shape[1] == n:
        return raw.transpose(0, 1)
    return raw


def vectors(t, how: str, image: tuple | None = None, module=None, model=None, producer=None):
    """(N×D float32 tensor, what was done). `image`: the input image's (H, W), and `module` the layer (in `model`),
    which tell an N×H×W×C output (core/layout.channels_last)."""
    if t.dim() == 1:
        return t[:, None].float(), "N → N×1"
    if t.dim() == 2:
        return t.float(), "as is (N×D)"
    if how == "auto":
        how = "mean"
    if how == "flatten":
        return t.flatten(1).float(), "flattened per sample"
    if t.dim() == 3:
        if how == "first":
            return t[:, 0].float(), "first token (N×L×D → N×D)"
        return t.float().mean(1), "mean over tokens (N×L×D → N×D)"
    if how == "first":
        raise OptionError("reduce", "first applies to N×L×D token outputs")
    if t.dim() == 4 and image is not None and channels_last(tuple(t.shape), image, module, model, producer):
        return t.float().mean((1, 2)), "global average pool, channels last (N×H×W×C → N×C)"
    return t.float().flatten(2).mean(-1), "global average pool (N×C×… → N×C)"


def _image_size(inputs) -> tuple | None:
    """(H, W) of the forward's image: its 4-D floating-point input of 1 or 3 channels, else its first 4-D one (a
    review: a mask given before the image was taken for it)."""
    images = [t for _, t in inputs.tensors() if t.dim() == 4 and t.is_floating_point()]
    image = next((t for t in images if t.shape[1] in (1, 3)), images[0] if images else None)
    return tuple(image.shape[-2:]) if image is not None else None


def nn_agreement(x, labels) -> float:
    import torch

    z = torch.nn.functional.normalize(x.double(), dim=1)
    sim = z @ z.T
    sim.fill_diagonal_(-float("inf"))
    nn = sim.argmax(1)
    lab = torch.as_tensor(labels)
    return float((lab[nn] == lab).double().mean())


def layer_output(model, inputs, layer: str):
    """(The first tensor the layer outputs in one forward pass (eval, no grad), on the CPU; for a layer without
    parameters, the module that made its input, core/layout.Producers.of)."""
    import torch


    module = module_named(model, layer)
    kept = {}

    def hook(mod, args, out):
        t = first_tensor(out)
        if t is not None and "x" not in kept:
            kept["x"] = t.detach().to("cpu", copy=True)   # a copy: an in-place op after the layer (ReLU) changes it
            kept["producer"] = producers.of(args, mod, t)

    tracker = ModuleTracker(model, record_shapes=False)
    producers = Producers(model)
    with leave_no_trace(model):
        model.eval()
        handle = module.register_forward_hook(hook)
        try:
            with torch.no_grad(), tracker, producers:
                try:
                    inputs.call(model)
                except Exception as exc:
                    raise forward_error(exc, tracker) from exc
        finally:
            handle.remove()
    if "x" not in kept:
        raise UsageError(f"layer {layer} did not run in forward (or returned no tensor)")
    raw = kept["x"]
    if not raw.is_floating_point():
        raise UsageError(f"layer {layer} returns {raw.dtype} values, not embeddings")
    return raw, kept.get("producer")


def run(model, inputs, opts: Options, ctx) -> Result:
    import torch

    raw, producer = layer_output(model, inputs, opts.layer)
    x, how = vectors(_batch_first(raw, inputs.batch_size), opts.reduce, _image_size(inputs),
                     model.get_submodule(opts.layer), model, producer)
    n, d = x.shape
    result = Result("embeddings", header={"layer": opts.layer, "mode": "eval, no grad (one forward pass)"})
    labels = None
    given = opts.labels if opts.labels is not None else ctx.batch_target
    if given is not None:
        lab = torch.as_tensor(given).detach().cpu()
        if lab.dim() == 2 and lab.shape[0] == n and lab.is_floating_point():
            lab = lab.argmax(1)  # one-hot / scores
        if lab.dim() != 1 or lab.shape[0] != n:
            result.notes.append(f"the batch target has shape {tuple(lab.shape)}, not one label per sample ({n}): no labels written")
        else:
            labels = [int(v) if not lab.is_floating_point() else float(v) for v in lab]
    finite = bool(torch.isfinite(x).all())
    norms = x.double().norm(dim=1)
    if raw.dim() == 3 and raw.shape[1] == n != raw.shape[0]:
        how = f"sequence-first L×N×D read as N×L×D; {how}"
    result.data.update({"layer_output_shape": list(raw.shape), "reduction": how, "samples": n, "dim": d,
                        "labels": labels is not None, "mean_norm": float(norms.mean()),
                        "finite": finite})
    # always present (null where not measured: no labels, or one sample with no neighbour), as the docs list them
    result.data["nearest_neighbour_same_label"] = nn_agreement(x, labels) if labels is not None and n > 1 else None
    result.data["classes"] = len(set(labels)) if labels is not None else None
    if not finite:
        result.add("non-finite-embedding", "error", opts.layer, "the layer's output holds NaN or Inf: the projector cannot show it")
    if n < 2:   # a projector of one point shows nothing (a source's default input is one sample)
        result.notes.append(f"{n} vector: the projector needs several samples to show anything; give a batch "
                            "(-i N×…, or --batch PATH:fn returning (inputs, labels))")
    rows = [{"sample": i, "label": labels[i] if labels else None, "norm": float(norms[i])} for i in range(min(n, 1000))]
    result.tables.append(Table("sample_norms", "Samples (first 1000)", [Column("sample", "sample", "int"),
                                                                  Column("label", "label"), Column("norm", "L2 norm", "float")],
                               rows, show=False))
    # for the projector (render/embeddings.py)
    result.artefacts.update(vectors=x, labels=labels, tag=opts.layer or "model",
                            sprite=sprite(inputs, n) if opts.sprite else None)
    if opts.images:   # the PCA preview, drawn by render/embeddings.py
        coords, explained = pca_2d(x)
        result.artefacts["pca_coords"] = coords.numpy()
        result.data["pca_explained_variance"] = explained
    result.summary += [("Vectors", f"{n} × {d} ({how})"),
                       ("Labels", f"{len(set(labels))} classes from the batch target" if labels else "none (give --batch PATH:fn returning (inputs, labels))")]
    if result.data["nearest_neighbour_same_label"] is not None:
        result.summary.append(("Nearest neighbour has same label", f"{result.data['nearest_neighbour_same_label']:.1%}"))
    return result


def sprite(inputs, n: int):
    """The projector's sprite: image inputs (N×{1,3}×H×W, one per sample) scaled to [0, 1] per
    sample; None for other inputs."""
    ts = inputs.tensors()
    if not ts:
        return None
    img = ts[0][1].detach().float().cpu()
    if img.dim() == 4 and img.shape[1] in (1, 3) and img.shape[0] == n:
        lo = img.amin(dim=(1, 2, 3), keepdim=True)
        hi = img.amax(dim=(1, 2, 3), keepdim=True)
        return (img - lo) / (hi - lo).clamp_min(1e-12)
    return None


def pca_2d(x):
    """(N×2 coordinates on the first two principal components, explained-variance fractions)."""
    import torch

    z = x.double() - x.double().mean(0, keepdim=True)
    if z.shape[0] < 2 or float(z.abs().max()) == 0:
        return torch.zeros(z.shape[0], 2, dtype=torch.float64), [0.0, 0.0]
    u, s, v = torch.linalg.svd(z, full_matrices=False)
    var = s ** 2
    k = min(2, s.numel())
    coords = z @ v[:k].T
    if k < 2:
        coords = torch.cat([coords, torch.zeros(z.shape[0], 1, dtype=torch.float64)], 1)
    frac = [float(var[i] / var.sum()) for i in range(k)] + [0.0] * (2 - k)
    return coords, frac
