"""Rich tables for people: results on stdout."""
from __future__ import annotations

from .fmt import cell

_SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}
_HEADER_SKIP = {"inputs", "input_notes"}


def _console():
    import os
    import sys

    from rich.console import Console

    # Piped into a file or a CI log Rich would assume 80 columns and fold every table.
    width = None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 120
    return Console(highlight=False, soft_wrap=False, width=width)


def print_result(result, console=None) -> None:
    from rich.table import Table
    from rich.text import Text

    con = console or _console()
    head = result.header
    line = Text(f"torchdiag {result.command}", style="bold")
    if head.get("model"):
        line.append(f"  {head['model']}", style="bold cyan")
    if head.get("device"):
        line.append(f"  on {head['device']}")
    con.print(line)
    if head.get("inputs"):
        con.print(f"  inputs ({head.get('input_source', '')}): " + "; ".join(head["inputs"]))
    for note in head.get("input_notes", []):
        con.print(f"  input note: {note}")
    for key, value in head.items():
        if key in ("model", "device", "input_source") or key in _HEADER_SKIP:
            continue
        con.print(f"  {key.replace('_', ' ')}: {value}")

    for t in result.tables:
        if not t.show or not t.rows:
            continue
        table = Table(title=t.title, title_justify="left", title_style="bold", show_lines=False)
        for i, c in enumerate(t.columns):
            title = f"{c.title} ({c.unit})" if c.unit else c.title
            justify = "left" if c.kind in ("text", "bar") else "right"
            # the first column names the row (module, parameter): never break it mid-name
            table.add_column(title, justify=justify, overflow="fold", no_wrap=(i == 0))
        shown = t.rows if t.limit is None else t.rows[: t.limit]
        for row in shown:
            style = row.get("_style")
            table.add_row(*[cell(row.get(c.key), c.kind) for c in t.columns], style=style)
        con.print(table)
        if len(shown) < len(t.rows):
            con.print(f"  … {len(t.rows) - len(shown)} more row(s) in --json", style="dim")
        if t.note:
            con.print(f"  {t.note}", style="dim")

    if result.summary:
        width = max(len(k) for k, _ in result.summary)
        for label, value in result.summary:
            con.print(f"{label.ljust(width)}  {value}")
    for note in result.notes:
        con.print(f"note: {note}", style="dim")
    for f in result.findings:
        where = f" {f.where}" if f.where else ""
        con.print(Text(f"{f.severity.upper():7} {f.code}{where}: ", style=_SEVERITY_STYLE.get(f.severity, "")) +
                  Text(f.message))
        if f.hint:
            con.print(f"        hint: {f.hint}", style="dim")
    if result.verdict:
        style = "bold red" if result.exit_code else "bold green"
        con.print(result.verdict, style=style)
