"""`--tb DIR`: the result as TensorBoard events under DIR/<command>/ (flushed and closed)."""
from __future__ import annotations

import contextlib
import numbers
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..fmt import cell
from .output import write_error as output_error


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
    """A SummaryWriter for DIR/<command>/; callers must close() it (inside `guarded`). A writer that cannot
    even write its file's first record (a full disk) is one line, exit 2, and leaves no event file."""
    from ..core.interrupts import deferred

    with deferred():   # tensorboard and protobuf imported whole: an error path imports them again (core/interrupts)
        from torch.utils.tensorboard import SummaryWriter

    path = Path(logdir) / command
    before = set(path.glob("events.out.tfevents.*")) if path.is_dir() else set()
    try:
        path.mkdir(parents=True, exist_ok=True)
        with _quiet_threads():
            writer = SummaryWriter(log_dir=str(path), flush_secs=5)
            if _worker(writer) is not None:
                _OURS.add(_worker(writer))
        return writer, path
    except FileExistsError:
        raise UsageError(f"--tb {logdir}: {path} is a file, not a folder", hint="give a folder name") from None
    except OSError as exc:   # a review: a 0-byte event file was left, and the writer thread's traceback shown
        for name in set(path.glob("events.out.tfevents.*")) - before:
            _unlink(name)
        raise output_error(path, "--tb", exc) from None


def _event_file(writer) -> str | None:
    return getattr(getattr(getattr(writer, "file_writer", None), "event_writer", None), "_file_name", None)


def _worker(writer):
    """The thread that writes the writer's events (TensorBoard's _AsyncWriterThread), or None."""
    events = getattr(getattr(writer, "file_writer", None), "event_writer", None)
    return getattr(getattr(events, "_async_writer", None), "_worker", None)


class _Threads:
    """TensorBoard's writer thread prints the traceback of what it could not write, then the writer raises it again
    in the main thread at its next write or close: we report that one, once. The hook, put in place once, keeps
    quiet the OSErrors of our writers' threads, and of any while ours is being made (its thread may fail before it
    is known); every other thread's go to the hook that was there."""

    def __init__(self):
        self.making = 0
        self.previous = None

    def hook(self, args) -> None:
        if isinstance(args.exc_value, OSError) and (self.making or args.thread in _OURS):
            return
        (self.previous or _threading().__excepthook__)(args)


_OURS: Any = None
_THREADS = _Threads()


def _threading():
    import threading

    return threading


@contextlib.contextmanager
def _quiet_threads():
    global _OURS
    threading = _threading()
    if _OURS is None:
        import weakref

        _OURS = weakref.WeakSet()
    if threading.excepthook is not _THREADS.hook:
        _THREADS.previous, threading.excepthook = threading.excepthook, _THREADS.hook
    _THREADS.making += 1
    try:
        yield
    finally:
        _THREADS.making -= 1


@contextlib.contextmanager
def guarded(writer, path, option: str = "--tb", extra=()):
    """Write through `writer` and close it. A failed write (full disk, read-only folder) is one line,
    exit 2: the writer thread's own traceback is kept off stderr (_Threads), and the event file (and any
    `extra` paths) this write created are removed, so no partial or empty file is left."""
    import shutil

    try:
        try:
            yield writer
        finally:
            writer.close()
    except OSError as exc:
        for name in (_event_file(writer), *extra):
            if name:
                shutil.rmtree(name, ignore_errors=True) if Path(name).is_dir() else _unlink(name)
        raise output_error(path, option, exc) from None


def _unlink(name) -> None:
    with contextlib.suppress(OSError):
        Path(name).unlink()


def write_result(result, logdir) -> Path:
    from .images import drawn

    drawn(result)   # the pictures a diagnostic described (activations, attention, gradcam) go to result.images
    writer, path = open_writer(logdir, result.command)
    with guarded(writer, path):
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
        graph = result.artefacts.get("tb_graph")
        if graph is not None:   # (GraphDef, RunMetadata) a diagnostic traced: the Graphs tab
            writer._get_file_writer().add_graph(graph)
        writer.flush()
    return path


def write_error(logdir, command: str, message: str, hint: str | None, code: int) -> Path:
    writer, path = open_writer(logdir, command)
    with guarded(writer, path):
        writer.add_text(f"{command}/error", f"**exit {code}**: {message}" + (f"\n\nhint: {hint}" if hint else ""))
        writer.flush()
    return path
