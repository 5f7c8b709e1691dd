"""embeddings: a layer's outputs for the batch, for TensorBoard's projector (PCA / t-SNE / UMAP).

One forward pass (eval, no grad); a forward hook keeps the layer's first tensor output. Each
sample becomes one vector: N×D as is; N×L×D (tokens) reduced over L (`mean`, `first` = CLS
token, or `flatten`); N×C×H×W reduced by global average pooling (`mean`) or `flatten`.
Written with SummaryWriter.add_embedding under DIR/embeddings/ (tensors.tsv, metadata.tsv when
labels exist, a sprite of the input images when the inputs are N×{1,3}×H×W, and
projector_config.pbtxt). Labels come from the target of a --batch function. With labels, the
fraction of samples whose nearest neighbour (cosine) has the same label is reported."""
from __future__ import annotations

from dataclasses import dataclass

from ..core.guard import leave_no_trace
from ..core.tracking import ModuleTracker, forward_error
from ..errors import UsageError
from ..results import Column, Result, Table

REDUCTIONS = ("auto", "mean", "first", "flatten")


@dataclass
class Options:
    layer: str = ""
    logdir: str | None = None
    reduce: str = "auto"
    labels: object = None        # 1-D tensor/list of N labels, or None
    sprite: bool = True
    images: str | None = None    # folder for a PCA preview (embeddings_pca.png)


def vectors(t, how: str):
    """(N×D float32 tensor, what was done)."""
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
        raise UsageError("--reduce first applies to N×L×D token outputs")
    return t.float().flatten(2).mean(-1), "global average pool (N×C×… → N×C)"


def nn_agreement(x, labels) -> float:
    import torch

    z = torch.nn.functional.normalize(x.double(), dim=1)
    sim = z @ z.T
    sim.fill_diagonal_(-float("inf"))
    nn = sim.argmax(1)
    lab = torch.as_tensor(labels)
    return float((lab[nn] == lab).double().mean())


def run(model, inputs, opts: Options) -> Result:
    import torch

    if opts.reduce not in REDUCTIONS:
        raise UsageError(f"unknown --reduce '{opts.reduce}'", hint=f"choose {'|'.join(REDUCTIONS)}")
    if any(t.device.type == "meta" for _, t in inputs.tensors()) or \
            any(t.device.type == "meta" for t in list(model.parameters()) + list(model.buffers())):
        raise UsageError("embeddings needs real values; the meta device has none", hint="use --device cpu or cuda")
    names = dict(model.named_modules())
    if opts.layer not in names:
        import difflib

        close = difflib.get_close_matches(opts.layer, [n for n in names if n], n=3, cutoff=0.5)
        raise UsageError(f"no module named '{opts.layer}' in the model",
                         hint=(f"did you mean {', '.join(close)}?" if close else "module paths are listed by `torchdiag summary`"))
    from .activations import first_tensor

    kept = {}

    def hook(mod, args, out):
        t = first_tensor(out)
        if t is not None and "x" not in kept:
            kept["x"] = t.detach().cpu()

    tracker = ModuleTracker(model, record_shapes=False)
    with leave_no_trace(model):
        model.eval()
        handle = names[opts.layer].register_forward_hook(hook)
        try:
            with torch.no_grad(), tracker:
                try:
                    inputs.call(model)
                except Exception as exc:
                    raise forward_error(exc, tracker) from exc
        finally:
            handle.remove()
    if "x" not in kept:
        raise UsageError(f"layer {opts.layer} did not run in forward (or returned no tensor)")
    raw = kept["x"]
    if not raw.is_floating_point():
        raise UsageError(f"layer {opts.layer} returns {raw.dtype} values, not embeddings")
    x, how = vectors(raw, opts.reduce)
    n, d = x.shape
    result = Result("embeddings", header={"layer": opts.layer, "mode": "eval, no grad (one forward pass)"})
    labels = None
    if opts.labels is not None:
        lab = torch.as_tensor(opts.labels).detach().cpu()
        if lab.dim() == 2 and lab.shape[0] == n and lab.is_floating_point():
            lab = lab.argmax(1)  # one-hot / scores
        if lab.dim() != 1 or lab.shape[0] != n:
            result.notes.append(f"the batch target has shape {tuple(lab.shape)}, not one label per sample ({n}): no labels written")
        else:
            labels = [int(v) if not lab.is_floating_point() else float(v) for v in lab]
    finite = bool(torch.isfinite(x).all())
    norms = x.double().norm(dim=1)
    result.data.update({"layer_output_shape": list(raw.shape), "reduction": how, "samples": n, "dim": d,
                        "labels": labels is not None, "mean_norm": float(norms.mean()),
                        "finite": finite})
    if labels is not None and n > 1:
        result.data["nearest_neighbour_same_label"] = nn_agreement(x, labels)
        result.data["classes"] = len(set(labels))
    if not finite:
        result.add("non-finite-embedding", "error", opts.layer, "the layer's output holds NaN or Inf: the projector cannot show it")
    rows = [{"sample": i, "label": labels[i] if labels else None, "norm": float(norms[i])} for i in range(min(n, 1000))]
    result.tables.append(Table("sample_norms", "Samples (first 1000)", [Column("sample", "sample", "int"),
                                                                  Column("label", "label"), Column("norm", "L2 norm", "float")],
                               rows, show=False))
    if opts.logdir:
        path = write_projector(x, labels, inputs if opts.sprite else None, opts.logdir, opts.layer)
        result.data["projector_dir"] = str(path)
        result.summary.append(("Projector", f"{path}  (tensorboard --logdir {opts.logdir}, PROJECTOR tab)"))
    if opts.images:
        from pathlib import Path

        from ..render.images import safe_name, save_png

        img, explained = pca_picture(x, labels, opts.layer)
        path = save_png(img, Path(opts.images) / f"embeddings_{safe_name(opts.layer)}_pca.png")
        result.data["pca_image"] = str(path)
        result.data["pca_explained_variance"] = explained
        result.summary.append(("PCA preview", f"{path} (PC1+PC2 explain {sum(explained):.1%} of the variance)"))
    result.summary += [("Vectors", f"{n} × {d} ({how})"),
                       ("Labels", f"{len(set(labels))} classes from the batch target" if labels else "none (give --batch PATH:fn returning (inputs, labels))")]
    if "nearest_neighbour_same_label" in result.data:
        result.summary.append(("Nearest neighbour has same label", f"{result.data['nearest_neighbour_same_label']:.1%}"))
    result._vectors = x
    return result


def write_projector(x, labels, inputs, logdir, layer):
    import torch

    from ..render.tensorboard import open_writer

    label_img = None
    if inputs is not None:
        ts = inputs.tensors()
        if ts:
            img = ts[0][1].detach().float().cpu()
            if img.dim() == 4 and img.shape[1] in (1, 3) and img.shape[0] == x.shape[0]:
                lo = img.amin(dim=(1, 2, 3), keepdim=True)
                hi = img.amax(dim=(1, 2, 3), keepdim=True)
                label_img = (img - lo) / (hi - lo).clamp_min(1e-12)
    writer, path = open_writer(logdir, "embeddings")
    # a new step per run, so a second run into the same DIR adds to the projector instead of overwriting
    step = sum(1 for p in path.iterdir() if p.is_dir() and p.name.isdigit())
    try:
        writer.add_embedding(x, metadata=labels, label_img=label_img, global_step=step, tag=layer or "model")
        writer.flush()
    finally:
        writer.close()
    del torch
    return path


PCA_SIZE = (400, 400)   # pixels (height, width) of the preview


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


def pca_picture(x, labels, title):
    """A scatter of the samples on PC1/PC2, coloured by label, as an HxWx3 uint8 array."""
    from matplotlib.figure import Figure

    from ..render.images import figure_to_array

    coords, frac = pca_2d(x)
    fig = Figure(figsize=(PCA_SIZE[1] / 100, PCA_SIZE[0] / 100), dpi=100)
    ax = fig.subplots()
    c = coords.numpy()
    if labels is not None:
        sc = ax.scatter(c[:, 0], c[:, 1], c=labels, cmap="tab10", s=14)
        if len(set(labels)) <= 10:
            ax.legend(*sc.legend_elements(), fontsize=6, loc="best", title="label", title_fontsize=6)
    else:
        ax.scatter(c[:, 0], c[:, 1], s=14)
    ax.set_xlabel(f"PC1 ({frac[0]:.0%})", fontsize=8)
    ax.set_ylabel(f"PC2 ({frac[1]:.0%})", fontsize=8)
    ax.tick_params(labelsize=6)
    ax.set_title(f"{title}: {x.shape[0]} samples × {x.shape[1]} dims", fontsize=8)
    fig.tight_layout()
    return figure_to_array(fig), frac
