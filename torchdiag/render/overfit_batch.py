"""Files of `overfit-batch`: the loss curve (`--plot FILE.png|.svg|.pdf`)."""
from __future__ import annotations

from .plots import pyplot, save


def write_plot(result, path) -> str:
    """The loss curve (and the pass threshold) as an image; returns the path written."""
    import math

    plt = pyplot()

    losses = result.series.get("loss", [])
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    try:
        ax.plot(range(len(losses)), losses, lw=1.5, label="loss")
        finite = [v for v in losses if math.isfinite(v)]
        if finite and min(finite) > 0:
            ax.set_yscale("log")
        initial = result.data.get("initial_loss")
        if initial is not None and math.isfinite(initial) and initial > 0:
            ax.axhline(result.data["target_ratio"] * initial, color="tab:green", ls="--", lw=1,
                       label=f"target {result.data['target_ratio']:g} × initial")
        if result.data.get("target_loss") is not None:
            ax.axhline(result.data["target_loss"], color="tab:olive", ls=":", lw=1, label="--target-loss")
        ax.set_xlabel("step")
        ax.set_ylabel("loss")
        d = result.data
        verdict = ("interrupted" if d.get("interrupted") else "PASS" if d.get("passed") else
                   "NOT YET (still falling)" if any(f.code == "not-overfit-yet" for f in result.findings) else "FAIL")
        ax.set_title(f"overfit-batch {result.header.get('model', '')}: {verdict}", fontsize=9)
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        fig.tight_layout()
    except BaseException:
        plt.close(fig)
        raise
    return save(fig, path)


# the files this command writes, by the kind its caller asks for (RenderSpec.outputs)
WRITERS = {"plot": write_plot}
