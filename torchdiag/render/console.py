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


def _runs(items: list) -> list:
    """A header list with runs of one item told once with their count (a model per task: 60 × 'Sequential')."""
    out: list = []
    for item in items:
        if out and out[-1][0] == item:
            out[-1][1] += 1
        else:
            out.append([item, 1])
    return [item if n == 1 else f"{item} ×{n}" for item, n in out]


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
        if key in ("model", "device", "input_source") or key in _HEADER_SKIP or (isinstance(value, (list, str)) and not value):
            continue   # (nothing to say: watch's "optimizers: " of a script that failed before its first step)
        # a list as its items, not Python's repr of it (a review: "checkpoint: ['w.pt: 6 tensors loaded']")
        shown = "; ".join(map(str, _runs(value))) if isinstance(value, list) else value
        con.print(_text(f"  {key.replace('_', ' ')}: {shown}"))

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
            con.print(_indented(f"hint: {f.hint}", 8, "dim"))
    if result.verdict:
        con.print(_text(result.verdict, "bold red" if result.exit_code else "bold green"))


def _wrapped(title: str, width: int) -> str:
    import textwrap

    return "\n".join(textwrap.wrap(title, width, break_long_words=False, break_on_hyphens=False)) or title


def _print_table(con, t) -> None:
    """Fit the table to the console: numbers, bars and status words are never split across lines; text
    columns wrap between words, and the first (the row's name) takes at most half the width. When even
    that is too wide, note columns (long hints) go under the table, then the least needed columns are
    hidden (named under the table; --json has them): a status is never cut."""
    from rich.table import Table

    shown = [r for r in t.rows if not r.get("_hidden")]   # display-only: a brief table (JSON has every row)
    shown = shown if t.limit is None else shown[: t.limit]
    cells = [[cell(row.get(c.key), c.kind) for c in t.columns] for row in shown]
    plan = _Plan(t.columns, cells, max(24, con.width // 2))
    widths = plan.fit(con.width)
    table = Table(title=t.title, title_justify="left", title_style="bold", show_lines=False)
    for i in plan.keep:
        c, title = t.columns[i], plan.titles[i]
        if widths and plan.atomic[i]:  # its header gives way between words (its values cannot)
            title = _wrapped(title, widths[i])
        elif i in plan.header_widths:  # Rich cannot narrow a no_wrap header: wrapped here, or the row is cut
            title = _wrapped(title, plan.header_widths[i])
        table.add_column(_text(title), justify="left" if c.kind in ("text", "bar", "status", "note") else "right",
                         no_wrap=plan.atomic[i], overflow="fold", width=widths.get(i), min_width=plan.min_widths.get(i),
                         max_width=plan.half if i == 0 else None)
    for row, values in zip(shown, cells):
        table.add_row(*[_text(values[i]) for i in plan.keep], style=row.get("_style"))
    con.print(table)
    _under(con, t, plan, cells, shown)


def _under(con, t, plan, cells, shown) -> None:
    """What did not fit in the table, then its own lines."""
    for i in plan.moved:
        for values in cells:
            if values[i] and values[i] != "—":
                con.print(_indented(f"{plan.titles[i]} · {values[0]}: {values[i]}", 2, "dim"))
    if plan.hidden:
        names = ", ".join(plan.titles[i] for i in plan.hidden)
        con.print(_indented(f"not shown at {con.width} columns: {names} (a wider terminal or --json has them)", 2, "dim"))
    if len(shown) < len(t.rows):
        con.print(_text(f"  … {len(t.rows) - len(shown)} more row(s) in --json", "dim"))
    if t.note:
        con.print(_indented(t.note, 2, "dim"))


# Which columns give way first when a table is too wide: decoration, then numbers, then other text, each
# from the right. The first column (the row's name) and status columns always stay.
_DROP_ORDER = ("bar", "float", "pct", "int", "count", "bytes", "flops", "text")


class _Plan:
    """Which columns a table shows at a width, and how wide each is."""

    def __init__(self, columns, cells, half: int):
        self.columns, self.half = columns, half
        self.titles = [f"{c.title} ({c.unit})" if c.unit else c.title for c in columns]
        n = len(columns)
        self.longest = [max((len(r[i]) for r in cells), default=0) for i in range(n)]
        words = [max((len(w) for r in cells for w in r[i].split()), default=0) for i in range(n)]
        title_words = [max((len(x) for x in h.split()), default=0) for h in self.titles]
        # numbers, sizes, bars and status words are one piece each; so is a row name that fits in half the width
        self.atomic = [c.kind not in ("text", "note") or (i == 0 and self.longest[i] <= half)
                       for i, c in enumerate(columns)]
        # narrowest: headers wrapped between words; text at its longest word (a longer one folds)
        self.narrowest = [max(m, tw) if a else min(max(w, tw), half if i == 0 else 24)
                          for i, (m, w, tw, a) in enumerate(zip(self.longest, words, title_words, self.atomic))]
        self.full = [min(max(m, len(h)), half) if i == 0 else max(m, len(h))
                     for i, (m, h) in enumerate(zip(self.longest, self.titles))]
        self.keep = list(range(n))
        self.moved: list[int] = []
        self.hidden: list[int] = []
        self.min_widths: dict[int, int] = {}
        self.header_widths: dict[int, int] = {}

    def _room(self, width: int) -> int:
        return width - 3 * len(self.keep) - 1

    def fit(self, width: int) -> dict[int, int]:
        """{} when every column fits whole; else the width of each kept column, after moving notes under the
        table and hiding what must give way."""
        if sum(self.full[i] for i in self.keep) <= self._room(width):
            return {}
        comfortable = [self.narrowest[i] if self.atomic[i] else min(self.full[i], max(self.narrowest[i], 24))
                       for i in range(len(self.columns))]
        if sum(comfortable[i] for i in self.keep) <= self._room(width):   # text wraps, but reads well: Rich lays it out
            self.min_widths = {i: comfortable[i] for i in self.keep}
            self._header_room(width, comfortable)
            return {}
        for i, c in enumerate(self.columns):          # long hints read better as lines under the table
            if c.kind == "note" and i:
                self.keep.remove(i)
                self.moved.append(i)
        for kind in _DROP_ORDER:
            for i in reversed(range(1, len(self.columns))):
                if sum(self.full[j] for j in self.keep) <= self._room(width):
                    return {}
                if sum(self.narrowest[j] for j in self.keep) <= self._room(width):
                    return self._widths(width)
                if self.columns[i].kind == kind and i in self.keep:
                    self.keep.remove(i)
                    self.hidden.insert(0, i)
        return self._widths(width)

    def _header_room(self, width: int, comfortable: list[int]) -> None:
        """Number columns whose header is longer than their values get their whole header while the room
        lasts (left first); the others have theirs wrapped between words at their values' width."""
        spare = self._room(width) - sum(comfortable[i] for i in self.keep)
        for i in self.keep:
            extra = self.full[i] - comfortable[i]
            if not self.atomic[i] or extra <= 0:
                continue
            if extra <= spare:
                spare -= extra
            else:
                self.header_widths[i] = comfortable[i]

    def _widths(self, width: int) -> dict[int, int]:
        """Atomic columns at their narrowest; text columns share the rest by how much more they would take."""
        widths = {i: self.narrowest[i] for i in self.keep}
        text = [i for i in self.keep if not self.atomic[i]]
        spare = self._room(width) - sum(widths.values())
        want = sum(self.full[i] - self.narrowest[i] for i in text)
        for i in text:
            if spare > 0 and want > 0:
                widths[i] += min(self.full[i] - self.narrowest[i], spare * (self.full[i] - self.narrowest[i]) // want)
        return widths


def _indented(text: str, indent: int, style: str = ""):
    """A line whose wrapped continuation lines keep its indent."""
    from rich.padding import Padding

    return Padding(_text(text, style), (0, 0, 0, indent))
