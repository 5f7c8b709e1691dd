"""gradflow's files: the gradient-flow figure (--plot) and per-layer norms as TensorBoard scalars.
Both read the `layers` table of the Result; neither runs a model."""
from __future__ import annotations

import math

from ..errors import UsageError, one_line
from ..pictures import need_pictures

PLOT_SUFFIXES = (".png", ".svg", ".pdf")   # --plot: what the figure is written as (by the name's suffix)


def check_plot_backend() -> None:
    """--plot needs matplotlib (the optional `plot` extra): a usage error, before any work."""
    need_pictures("--plot", ("matplotlib",))


def plot_rows(result) -> list[dict]:
    """The layers the figure shows: those that ran and are not frozen, in execution order."""
    return [r for r in result.table("layers").rows if r["ran"] and r["status"] != "frozen"]


def write_plot(result, path) -> str:
    """The classic gradient-flow figure: max and mean |grad| per layer, log scale, execution order."""
    from .output import atomic_path
    from .plots import image_format

    check_plot_backend()
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    fig = _figure(plt, plot_rows(result), result.header.get("model", ""), flagged_layers(result))
    try:
        with atomic_path(path, "--plot") as tmp:
            try:
                fig.savefig(tmp, format=image_format(path))
            except ValueError as exc:
                raise UsageError(f"--plot: cannot write {path}: {one_line(exc)}") from exc
    finally:
        plt.close(fig)
    return str(path)


def flagged_layers(result) -> set[str]:
    """The layers a warning or an error names (itself, a parameter or a module inside it): the figure
    shades those only, never an info-level (by-design) row."""
    # a finding on a stack's blocks (core/repeats.py) names the parameters it covers
    places = [p for f in result.findings if f.severity in ("error", "warning") and f.where
              for p in (f.members or [f.where.split(" ", 1)[0]])]
    return {r["layer"] for r in result.table("layers").rows
            if any(p == r["layer"] or p.startswith(r["layer"] + ".") or not r["layer"] for p in places)}


def _figure(plt, rows, model: str, flagged: set[str]):
    tiny = 1e-30

    def val(x):
        return x if x is not None and math.isfinite(x) and x > 0 else tiny

    maxes = [val(r["max_abs_grad"]) for r in rows]
    means = [val(r["mean_abs_grad"]) for r in rows]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.35 * len(rows) + 2), 4.5), dpi=100)
    x = list(range(len(rows)))
    ax.bar(x, maxes, alpha=0.35, lw=1, color="c", label="max |grad|")
    ax.bar(x, means, alpha=0.6, lw=1, color="b", label="mean |grad|")
    ax.set_yscale("log")
    finite = [v for v in maxes + means if v > tiny]
    if finite:
        ax.set_ylim(min(finite) / 10, max(finite) * 10)
    bad = [i for i, r in enumerate(rows) if r["status"] != "ok" and r["layer"] in flagged]
    for i in bad:
        ax.axvspan(i - 0.5, i + 0.5, color="r", alpha=0.12)
    if bad:
        from matplotlib.patches import Patch

        handles, names = ax.get_legend_handles_labels()
        handles.append(Patch(color="r", alpha=0.12))
        names.append("flagged (" + ", ".join(sorted({rows[i]["status"] for i in bad})) + ")")
        ax.legend(handles, names, loc="upper right", fontsize=8)
    else:
        ax.legend(loc="upper right", fontsize=8)
    ax.set_xticks(x)
    ax.set_xticklabels([r["_label"] for r in rows], rotation=90, fontsize=7)
    ax.set_xlim(-0.75, len(rows) - 0.25)
    ax.set_xlabel("layer (execution order)")
    ax.set_ylabel("|gradient|")
    ax.set_title(f"Gradient flow — {model}", fontsize=9)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def write_tb_layers(result, logdir) -> str:
    """Per-layer norms as TensorBoard scalars (--tb): `gradflow/layer_grad_norm/<layer>` and
    `gradflow/layer_weight_norm/<layer>` at step 0, and `gradflow/grad_norm_by_layer` with the layer's
    execution index as the step (the flow as a curve). Layers with a non-finite grad norm are left out."""
    from .tensorboard import guarded, open_writer

    writer, path = open_writer(logdir, "gradflow")
    with guarded(writer, path):
        rows = [r for r in result.table("layers").rows if r["grad_norm"] is not None]
        for i, r in enumerate(rows):
            tag = r["layer"] or "root"
            if math.isfinite(r["grad_norm"]):
                writer.add_scalar(f"gradflow/layer_grad_norm/{tag}", r["grad_norm"], 0)
                writer.add_scalar("gradflow/grad_norm_by_layer", r["grad_norm"], i)
                writer.add_scalar(f"gradflow/layer_weight_norm/{tag}", r["weight_norm"], 0)
        writer.flush()
    return str(path)


# the files this command writes, by the kind its caller asks for (RenderSpec.outputs)
WRITERS = {"plot": write_plot, "tb_layers": write_tb_layers}
