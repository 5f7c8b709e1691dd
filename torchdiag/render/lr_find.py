"""Files of `lr-find`: the range test's curves (`--plot FILE.png|.svg|.pdf`).

TensorBoard needs nothing here: render/tensorboard.py writes every series by step (`lr-find/lr`,
`lr-find/loss_r0`, `lr-find/smoothed_r0`, …, `lr-find/checked_1x`) and every number of data."""
from __future__ import annotations

from .plots import pyplot, save

COLOURS = ("tab:blue", "tab:purple", "tab:cyan", "tab:olive", "tab:brown")



def write_plot(result, path) -> str:
    """Left: loss against lr (log x), raw and smoothed per repeat, the suggestion, its band and the rate
    recommended after the check. Right: the checked runs' losses by update. Returns the path written."""
    plt = pyplot()

    art = result.artefacts.get("lr_find", {})
    checks = art.get("checks") or []
    fig, axes = plt.subplots(1, 2 if checks else 1, figsize=(11 if checks else 7, 4.2), dpi=110, squeeze=False)
    try:
        _curves(axes[0][0], art, result)
        if checks:
            _checks(axes[0][1], checks, art.get("recommended"))
        model = result.header.get("model") or "model"
        fig.suptitle(f"lr-find {model}: {_title(result)}", fontsize=9)
        fig.tight_layout()
    except BaseException:
        plt.close(fig)
        raise
    return save(fig, path)


def _title(result) -> str:
    d = result.data
    if d.get("recommended") is not None:
        if d.get("recommended_factor") == 1.0:
            return f"suggested lr {d['suggestion']:.3g}, kept by the checked runs"
        return f"recommended lr {d['recommended']:.3g} after the checked runs (curve's suggestion {d['suggestion']:.3g})"
    if d.get("suggestion") is not None:
        return f"suggested lr {d['suggestion']:.3g} (not checked)"
    return (result.verdict or "no suggestion").split(":")[0].lower()


def _curves(ax, art, result) -> None:
    import math

    for i, (lrs, raw, smooth) in enumerate(art.get("repeats") or []):
        colour = COLOURS[i % len(COLOURS)]
        ax.plot(lrs, raw, lw=0.8, alpha=0.35, color=colour)
        ax.plot(lrs, smooth[:len(lrs)], lw=1.6, color=colour, label=f"repeat {i + 1} (smoothed)")
    ax.set_xscale("log")
    _zoom(ax, art.get("repeats") or [])
    band, s = art.get("band"), art.get("suggestion")
    if band:
        ax.axvspan(band[0] / 1.15, band[1] * 1.15, color="tab:green", alpha=0.15, label="band over repeats")
    if s:
        ax.axvline(s, color="tab:green", ls="--", lw=1.2, label=f"suggestion {s:.3g}")
    rec = art.get("recommended")
    if rec and (not s or not math.isclose(rec, s)):
        ax.axvline(rec, color="tab:red", ls="-", lw=1.2, label=f"recommended {rec:.3g} (checked)")
    ax.set_xlabel("learning rate (log scale)")
    ax.set_ylabel("loss after the update")
    ax.set_title("range test", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def _zoom(ax, repeats) -> None:
    """The y range that shows the descent: from just below the lowest smoothed loss to 1.5 × the fall
    above the start (the blow-up at the top of the range is cut off, not drawn to scale)."""
    import math

    starts = [sm[0] for _, _, sm in repeats if sm]
    lows = [min(v for v in sm if math.isfinite(v)) for _, _, sm in repeats if any(math.isfinite(v) for v in sm)]
    if not starts or not lows:
        return
    top, low = max(starts), min(lows)
    fall = top - low
    if fall > 0 and all(math.isfinite(v) for v in (top, low)):
        ax.set_ylim(low - 0.1 * fall, top + 1.5 * fall)


def _checks(ax, checks, recommended) -> None:
    import math

    for factor, lr, losses in checks:
        finite = [v if math.isfinite(v) else float("nan") for v in losses]
        mark = " ← recommended" if recommended is not None and math.isclose(lr, recommended) else ""
        ax.plot(range(len(finite)), finite, lw=1.5, label=f"{factor:g}× = {lr:.3g}{mark}")
    values = [v for _, _, ls in checks for v in ls if math.isfinite(v)]
    if values and min(values) > 0 and max(values) / min(values) > 100:
        ax.set_yscale("log")
    ax.set_xlabel("update")
    ax.set_ylabel("loss")
    ax.set_title("checked runs (same weights, batch, seed)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


# the files this command writes, by the kind its caller asks for (RenderSpec.outputs)
WRITERS = {"plot": write_plot}
