"""Files of `embeddings`: the TensorBoard projector data (`--tb DIR`) and the PCA preview (`--images DIR`).

From Python: `r = torchdiag.embeddings(model, x, layer="head.0")`, then
`torchdiag.render.embeddings.write_projector(r, "runs")` (and `tensorboard --logdir runs`)."""
from __future__ import annotations

from pathlib import Path

from ..pictures import PCA_SIZE


def write_projector(result, path) -> str:
    """The layer's vectors (labels, sprite) with SummaryWriter.add_embedding under PATH/embeddings/;
    each run is a new step, so a second run into the same folder adds to the projector instead of
    overwriting it. Returns PATH/embeddings."""
    from .tensorboard import guarded, open_writer

    a = result.artefacts
    writer, run_dir = open_writer(path, "embeddings")
    step = sum(1 for p in run_dir.iterdir() if p.is_dir() and p.name.isdigit())
    # a failed write removes the step's folder: no partial tensors.tsv is left for the projector to read
    with guarded(writer, run_dir, "--tb", extra=(run_dir / f"{step:05d}",)):
        writer.add_embedding(a["vectors"], metadata=a.get("labels"), label_img=a.get("sprite"),
                             global_step=step, tag=a.get("tag") or "model")
        writer.flush()
    return str(run_dir)


def pca_picture(coords, labels, frac, title: str, subtitle: str = ""):
    """A scatter of the samples on PC1/PC2 (N×2 coordinates), coloured by label, under a two-line
    title, as an HxWx3 uint8 array."""
    from matplotlib.figure import Figure

    from ..pictures import TITLE_PX
    from .images import figure_to_array, title_lines

    H, W = PCA_SIZE
    fig = Figure(figsize=(W / 100, H / 100), dpi=100)
    title_lines(fig, title, subtitle)
    ax = fig.subplots()
    c = coords
    if labels is not None:
        sc = ax.scatter(c[:, 0], c[:, 1], c=labels, cmap="tab10", s=14)
        if len(set(labels)) <= 10:
            ax.legend(*sc.legend_elements(), fontsize=6, loc="best", title="label", title_fontsize=6)
    else:
        ax.scatter(c[:, 0], c[:, 1], s=14)
    ax.set_xlabel(f"PC1 ({frac[0]:.0%})", fontsize=8)
    ax.set_ylabel(f"PC2 ({frac[1]:.0%})", fontsize=8)
    ax.tick_params(labelsize=6)
    fig.tight_layout(rect=(0, 0, 1, 1 - TITLE_PX / H))
    return figure_to_array(fig)


def draw(result) -> None:
    """The PCA preview (artefacts["pca"]) from the coordinates the diagnostic computed."""
    from .images import model_name, png_text

    a, d = result.artefacts, result.data
    if a.get("pca_coords") is not None:
        layer = a.get("tag") or "model"
        title = f"embeddings · layer {layer} · PCA"
        subtitle = f"{model_name(result)} · {d['samples']} samples × {d['dim']} dims"
        a["pca"] = pca_picture(a["pca_coords"], a.get("labels"), d["pca_explained_variance"], title, subtitle)
        explained = ", ".join(f"PC{i + 1} {f:.1%}" for i, f in enumerate(d["pca_explained_variance"][:2]))
        a["pca_text"] = png_text(result, layer, title, f"{subtitle}; variance explained: {explained}")


def write_images(result, path) -> str:
    """embeddings_<layer>_pca.png (samples on PC1/PC2) in folder `path`; returns the file written."""
    from .images import drawn, safe_name, save_png

    drawn(result)
    name = f"embeddings_{safe_name(result.artefacts.get('tag') or 'model')}_pca.png"
    return str(save_png(result.artefacts["pca"], Path(path) / name, "--images", result.artefacts.get("pca_text")))


def record(result, written: dict) -> None:
    """The CLI's render_extra: where the files went, in the JSON document and the summary."""
    at = 0
    if written.get("projector"):
        result.data["projector_dir"] = written["projector"]
        logdir = Path(written["projector"]).parent
        result.summary.insert(at, ("Projector", f"{written['projector']}  (tensorboard --logdir {logdir}, PROJECTOR tab)"))
        at += 1
    else:   # the CLI without --tb: the figures alone
        result.summary.insert(at, ("Projector", "not written (--tb DIR writes it for TensorBoard's PROJECTOR tab)"))
        at += 1
    if written.get("images"):
        result.data["pca_image"] = written["images"]
        explained = sum(result.data.get("pca_explained_variance") or [0.0])
        result.summary.insert(at, ("PCA preview", f"{written['images']} (PC1+PC2 explain {explained:.1%} of the variance)"))


# the files this command writes, by the kind its caller asks for (RenderSpec.outputs)
WRITERS = {"projector": write_projector, "images": write_images}
