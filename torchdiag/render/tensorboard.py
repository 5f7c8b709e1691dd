"""`--tb DIR`: the result as TensorBoard events under DIR/<command>/ (flushed and closed)."""
from __future__ import annotations

import numbers
from pathlib import Path

from .fmt import cell


def table_markdown(t) -> str:
    head = "| " + " | ".join(c.title + (f" ({c.unit})" if c.unit else "") for c in t.columns) + " |"
    sep = "|" + "---|" * len(t.columns)
    rows = ["| " + " | ".join(cell(r.get(c.key), c.kind).replace("|", "\\|") for c in t.columns) + " |"
            for r in t.rows[:500]]
    return "\n".join([head, sep, *rows])


def write_row_scalars(writer, command: str, t) -> None:
    """Per-layer figures as scalars: `<command>/<table>/<column>/<row name>` at step 0, and
    `<command>/<table>/<column>_by_row` with the row's position as the step (the figure as a curve)."""
    for key in t.tb_scalars:
        for i, row in enumerate(t.rows):
            value = row.get(key)
            if isinstance(value, numbers.Number) and not isinstance(value, bool):
                writer.add_scalar(f"{command}/{t.key}/{key}/{row.get('name') or 'root'}", value, 0)
                writer.add_scalar(f"{command}/{t.key}/{key}_by_row", value, i)


def open_writer(logdir, command: str):
    """A SummaryWriter for DIR/<command>/; callers must close() it."""
    from torch.utils.tensorboard import SummaryWriter

    path = Path(logdir) / command
    path.mkdir(parents=True, exist_ok=True)
    return SummaryWriter(log_dir=str(path), flush_secs=5), path


def write_result(result, logdir) -> Path:
    writer, path = open_writer(logdir, result.command)
    try:
        header = "\n".join(f"- **{k}**: {v}" for k, v in result.header.items())
        writer.add_text(f"{result.command}/header", header or "-")
        for t in result.tables:
            if t.rows:
                writer.add_text(f"{result.command}/{t.key}", table_markdown(t))
            write_row_scalars(writer, result.command, t)
        if result.findings:
            writer.add_text(f"{result.command}/findings", "\n".join(
                f"- **{f.severity}** `{f.code}` {f.where}: {f.message}" for f in result.findings))
        for key, value in result.data.items():
            if isinstance(value, numbers.Number) and not isinstance(value, bool):
                writer.add_scalar(f"{result.command}/{key}", value, 0)
        for name, values in result.series.items():
            for step, v in enumerate(values):
                if v is not None:
                    writer.add_scalar(f"{result.command}/{name}", v, step)
        for tag, values in result.histograms.items():
            if len(values):
                writer.add_histogram(tag, values, 0)
        for tag, image in result.images.items():
            writer.add_image(tag, image, 0, dataformats="HWC")
        for tag, text in result.text.items():
            writer.add_text(tag, text)
        writer.flush()
    finally:
        writer.close()
    return path


def write_error(logdir, command: str, message: str, hint: str | None, code: int) -> Path:
    writer, path = open_writer(logdir, command)
    try:
        writer.add_text(f"{command}/error", f"**exit {code}**: {message}" + (f"\n\nhint: {hint}" if hint else ""))
        writer.flush()
    finally:
        writer.close()
    return path
