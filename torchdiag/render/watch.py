"""watch's drawing: the live status line (stderr), TensorBoard during the run (scalars, histograms,
hparams at the end) and the loss/gradient-norm figure. Fed by the engine's callbacks with torch-free
snapshots (`on_read(snapshot)`), `on_histograms(step, named_params)` and the final Result; it never
runs or reads the model itself.

    live = Live(status=None, logdir="runs", json=False)
    Watch(model, optimizer, **live.callbacks())      # the lead's torchdiag.watch / CLI glue

TensorBoard tags: watch/loss, watch/lr, watch/grad_norm (per step), watch/update_ratio/<parameter> (read
steps), weights/<parameter> and grads/<parameter> histograms (read steps), hparams at the end."""
from __future__ import annotations

import math
import sys

from .plots import pyplot, save


class StatusLine:
    """One line on stderr rewritten in place: `watch · step 350 · loss 0.1234 · 0 problems`.
    enabled=None: only when the stream is a terminal (a log file gets no carriage returns)."""

    def __init__(self, stream=None, enabled: bool | None = None):
        self.stream = stream if stream is not None else sys.stderr
        if enabled is None:
            try:
                enabled = bool(self.stream.isatty())
            except Exception:
                enabled = False
        self.enabled = enabled
        self.width = 0
        self.drawn = False

    def __call__(self, snap: dict) -> None:
        if not self.enabled:
            return
        loss = snap.get("loss")
        text = f"watch · step {snap['step']}"
        if snap.get("epoch") is not None:
            text += f" · epoch {snap['epoch']}"
        text += f" · loss {loss:.4g}" if isinstance(loss, float) else " · loss -"
        n = snap.get("problems", 0)
        text += f" · {n} problem{'s' if n != 1 else ''}"
        pad = max(0, self.width - len(text))
        self.width = len(text)
        try:
            self.stream.write("\r" + text + " " * pad)
            self.stream.flush()
            self.drawn = True
        except (OSError, ValueError):   # a closed or broken stderr never stops the training
            self.enabled = False

    def close(self) -> None:
        if self.drawn and self.enabled:
            try:
                self.stream.write("\n")
                self.stream.flush()
            except (OSError, ValueError):
                pass


class TensorBoardFeed:
    """Scalars and histograms under DIR/watch/ while the run goes; hparams and the close at the end."""

    def __init__(self, logdir, option: str = "--tb"):
        from .tensorboard import guarded, open_writer

        self.writer, self.path = open_writer(logdir, "watch")
        self._guard = guarded(self.writer, self.path, option)
        self._guard.__enter__()
        self.closed = False

    def on_read(self, snap: dict) -> None:
        w = self.writer
        for step, loss, norm, lr in snap.get("new", []):
            if loss is not None and math.isfinite(loss):
                w.add_scalar("watch/loss", loss, step)
            if norm is not None and math.isfinite(norm):
                w.add_scalar("watch/grad_norm", norm, step)
            if lr is not None:
                w.add_scalar("watch/lr", lr, step)
        for name, (step, ratio) in snap.get("ratios", {}).items():
            w.add_scalar(f"watch/update_ratio/{name}", ratio, step)

    def on_histograms(self, step: int, named) -> None:
        for name, p in named:
            values = p.detach().float().cpu()
            if bool(values.isfinite().all()):
                self.writer.add_histogram(f"weights/{name}", values, step)
            if p.grad is not None:
                g = p.grad.detach().float().cpu()
                if bool(g.isfinite().all()):
                    self.writer.add_histogram(f"grads/{name}", g, step)

    def close(self, result=None) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            if result is not None:
                # the texts every command's events hold (render/tensorboard.write_result): header, findings
                self.writer.add_text("watch/header", "\n".join(f"- **{k}**: {v}" for k, v in result.header.items()) or "-")
                if result.findings:
                    self.writer.add_text("watch/findings", "\n".join(
                        f"- **{f.severity}** `{f.code}` {f.where}: {f.message}" for f in result.findings))
                hp = {k: v for k, v in result.data.get("hparams", {}).items() if isinstance(v, (int, float, str, bool))}
                metrics = {f"final/{k}": v for k, v in result.data.get("final_metrics", {}).items()}
                if hp and metrics:
                    self.writer.add_hparams(hp, metrics, run_name="hparams")
                self.writer.flush()
        finally:
            self._guard.__exit__(None, None, None)


class Live:
    """The status line and (with a logdir) TensorBoard, as the callbacks a Watch takes."""

    def __init__(self, status: bool | None = None, logdir=None, json: bool = False, stream=None):
        self.status = StatusLine(stream, False if json else status)
        self.tb = TensorBoardFeed(logdir) if logdir else None

    def on_read(self, snap: dict) -> None:
        self.status(snap)
        if self.tb is not None:
            self.tb.on_read(snap)

    def on_finish(self, result) -> None:
        self.status.close()
        if self.tb is not None:
            self.tb.close(result)

    def __deepcopy__(self, memo):
        # the replay deep-copies the model, and with it the engine its hooks are bound to, which holds these
        # callbacks: the stream and the TensorBoard writer cannot be copied, and the copy must not draw anyway
        return self

    def callbacks(self) -> dict:
        return {"on_read": self.on_read, "on_finish": self.on_finish,
                "on_histograms": self.tb.on_histograms if self.tb is not None else None}


def write_plot(result, path) -> str:
    """Loss and gradient norm per step (log scale where positive over a decade or more), with the steps of error
    findings."""
    plt = pyplot()

    steps = result.series.get("step", [])
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(8, 5.5), dpi=110, sharex=True)
    try:
        for ax, key, label in ((a1, "loss", "loss"), (a2, "grad_norm", "gradient norm")):
            pairs = [(s, v) for s, v in zip(steps, result.series.get(key, [])) if v is not None and math.isfinite(v)]
            if pairs:
                ax.plot([s for s, _ in pairs], [v for _, v in pairs], lw=1.2, label=label)
                lo, hi = min(v for _, v in pairs), max(v for _, v in pairs)
                if lo > 0 and hi >= 10 * lo:   # within a decade a log axis labels 4.8x10^0, 4.6x10^0 (a sweep)
                    ax.set_yscale("log")
            ax.set_ylabel(label)
            ax.grid(alpha=0.3)
        bad = result.data.get("first_non_finite_step")
        if bad is not None:
            for ax in (a1, a2):
                ax.axvline(bad, color="tab:red", ls="--", lw=1, label=f"first non-finite (step {bad})")
            a1.legend(fontsize=8)
        a2.set_xlabel("optimizer step")
        a1.set_title(f"watch: {result.verdict or ''}", fontsize=9)
        fig.tight_layout()
    except BaseException:
        plt.close(fig)
        raise
    return save(fig, path)


def write_tb(result, logdir) -> str:
    """After the run (when no feed ran during it): the per-step series and hparams under DIR/watch/."""
    from .tensorboard import guarded, open_writer

    writer, path = open_writer(logdir, "watch")
    with guarded(writer, path):
        steps = result.series.get("step", [])
        for key in ("loss", "grad_norm", "lr"):
            for s, v in zip(steps, result.series.get(key, [])):
                if v is not None and math.isfinite(v):
                    writer.add_scalar(f"watch/{key}", v, s)
        for row in (result.table("layers").rows if result.table("layers") else []):
            if row.get("update_ratio") is not None:
                writer.add_scalar(f"watch/update_ratio/{row['name']}", row["update_ratio"], result.data.get("steps", 0))
        hp = {k: v for k, v in result.data.get("hparams", {}).items() if isinstance(v, (int, float, str, bool))}
        metrics = {f"final/{k}": v for k, v in result.data.get("final_metrics", {}).items()}
        if hp and metrics:
            writer.add_hparams(hp, metrics, run_name="hparams")
        writer.flush()
    return str(path)


# the CLI's --tb is written while the run goes (Live): render.write_tensorboard does not write it again;
# write_tb is for a Result in hand whose run had no feed
TENSORBOARD_LIVE = True
WRITERS = {"plot": write_plot, "tb": write_tb}
