"""Rich tables for people: results on stdout."""
from __future__ import annotations

from ..fmt import cell

_SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}
_HEADER_SKIP = {"inputs", "input_notes"}


def _console():
    import os
    import sys

    from rich.console import Console

    # Piped into a file or a CI log Rich would assume 80 columns and fold every table.
    width = None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 120
    return Console(highlight=False, soft_wrap=False, width=width)


def _text(value, style: str = ""):
    """Our strings hold the user's names and messages: never Rich markup (`dict[str, int]`, `[/x]`)."""
    from rich.text import Text

    return Text(str(value), style=style)


def print_result(result, console=None) -> None:
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
        con.print(_text(f"  inputs ({head.get('input_source', '')}): " + "; ".join(head["inputs"])))
    for note in head.get("input_notes", []):
        con.print(_text(f"  input note: {note}"))
    for key, value in head.items():
        if key in ("model", "device", "input_source") or key in _HEADER_SKIP:
            continue
        con.print(_text(f"  {key.replace('_', ' ')}: {value}"))

    for t in result.tables:
        if t.show and t.rows:
            _print_table(con, t)

    if result.summary:
        width = max(len(k) for k, _ in result.summary)
        for label, value in result.summary:
            con.print(_text(f"{label.ljust(width)}  {value}"))
    for note in result.notes:
        con.print(_text(f"note: {note}", "dim"))
    for f in result.findings:
        where = f" {f.where}" if f.where else ""
        con.print(Text(f"{f.severity.upper():7} {f.code}{where}: ", style=_SEVERITY_STYLE.get(f.severity, "")) +
                  Text(f.message))
        if f.hint:
            con.print(_text(f"        hint: {f.hint}", "dim"))
    if result.verdict:
        con.print(_text(result.verdict, "bold red" if result.exit_code else "bold green"))


def _wrapped(title: str, width: int) -> str:
    import textwrap

    return "\n".join(textwrap.wrap(title, width, break_long_words=True, break_on_hyphens=False)) or title


def _print_table(con, t) -> None:
    """Numbers and bars are never split across lines; text columns wrap, and the first (the row's name)
    takes at most half the width so the others keep room."""
    from rich.table import Table

    table = Table(title=t.title, title_justify="left", title_style="bold", show_lines=False)
    shown = t.rows if t.limit is None else t.rows[: t.limit]
    cells = [[cell(row.get(c.key), c.kind) for c in t.columns] for row in shown]
    half = max(24, con.width // 2)
    titles = [f"{c.title} ({c.unit})" if c.unit else c.title for c in t.columns]
    longest = [max((len(r[i]) for r in cells), default=0) for i in range(len(titles))]
    words = [max((len(w) for r in cells for w in r[i].split()), default=0) for i in range(len(titles))]
    # numbers, sizes and bars are one piece each; so is a row name that fits in half the width.
    # Other text wraps between words, never inside one (`no-grad`, `32x20`).
    atomics = [c.kind != "text" or (i == 0 and longest[i] <= half) for i, c in enumerate(t.columns)]
    narrowest = [max(len(h), n) if a else max([w, *(len(x) for x in h.split())])
                 for h, n, w, a in zip(titles, longest, words, atomics)]
    too_wide = sum(n + 3 for n in narrowest) + 1 > con.width
    for i, c in enumerate(t.columns):
        atomic, word, title = atomics[i], words[i], titles[i]
        if too_wide and atomic:  # its header gives way (it cannot wrap by itself), not the other columns
            title = _wrapped(title, max(longest[i], 4))
        table.add_column(_text(title), justify="left" if c.kind in ("text", "bar") else "right",
                         no_wrap=atomic, overflow="fold", min_width=longest[i] if atomic else word or None,
                         max_width=half if i == 0 else None)
    for row, values in zip(shown, cells):
        table.add_row(*[_text(v) for v in values], style=row.get("_style"))
    con.print(table)
    if len(shown) < len(t.rows):
        con.print(_text(f"  … {len(t.rows) - len(shown)} more row(s) in --json", "dim"))
    if t.note:
        con.print(_text(f"  {t.note}", "dim"))
