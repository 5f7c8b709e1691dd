"""The live progress bar of commands that train step by step (overfit-batch, lr-find): on stderr, on a
terminal only, never under --json. The diagnostic reports through its Options' `on_step(done, loss)`."""
from __future__ import annotations

import sys


def _terminal() -> bool:
    return sys.stderr.isatty()


def _bar(label: str, unit: str):
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    return Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(),
                    TextColumn("loss {task.fields[loss]}"), TextColumn(f"{{task.fields[rate]}} {unit}/s"),
                    TimeRemainingColumn(), TextColumn("left"),   # to the budget as it stands (a slow model's
                    console=Console(stderr=True), transient=True)   # default budget can take half an hour on a CPU)


def with_progress(diag, json_mode: bool, label: str, unit: str, total):
    """diag.run with a live bar whose total is `total(options)`; the rate counts from the first report (set-up
    excluded). Ctrl-C keeps the partial result (the diagnostic's own handling), rendered like any other."""
    import dataclasses
    import time

    def run(model, inputs, options, ctx):
        if json_mode or not _terminal():
            return diag.run(model, inputs, options, ctx)
        bar = _bar(label, unit)
        with bar:
            task = bar.add_task(label, total=total(options), loss="—", rate="—")
            first: list[tuple[float, int]] = []

            def on_step(done: int, loss: float | None) -> None:
                now = time.perf_counter()
                if not first:
                    first.append((now, done))
                dt, n = now - first[0][0], done - first[0][1]
                bar.update(task, completed=done, loss="—" if loss is None else f"{loss:.4g}",
                           rate=f"{n / dt:.1f}" if dt > 0 else "—")

            hooks = {"on_step": on_step}
            if "on_budget" in {f.name for f in dataclasses.fields(options)}:   # a run extended while still improving
                hooks["on_budget"] = lambda steps: bar.update(task, total=steps)
            return diag.run(model, inputs, dataclasses.replace(options, **hooks), ctx)

    return run
