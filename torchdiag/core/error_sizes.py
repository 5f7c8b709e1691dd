"""Sizes a model's own error asks for, when none of a source's default layouts runs (core.inputs._first_that_runs).

A forward that refuses a made-up input often says the size it wanted: "The size of tensor a (80) must match the size
of tensor b (560)", "must be a multiple of `n_window * 2` (100)", "expected input[1, 128, 160] to have 1 channels,
but got 128 channels", "Input height (224) doesn't match model (336)". Each gives (old, new): a size of the layout
after its batch dimension, and the one to try instead. Which dimensions hold it is not said, so the variants are
the sets of its positions, smallest first (a feature map's height and width change together; a spectrogram's frame
count in its features and in their mask together, not its mel bins): each is one probe forward, at most MAX_TRIES
per layout and round. Nothing here knows a model: only what its error says."""
from __future__ import annotations

import itertools
import math
import re

MAX_POSITIONS = 4   # positions of one size changed at most (2^4 - 1 sets)
MAX_TRIES = 8       # variants probed per (layout, size) asked for

_PAIRS = [re.compile(r"size of tensor a \((\d+)\) must match the size of tensor b \((\d+)\)"),
          re.compile(r"\((\d+)\) doesn'?t match model \((\d+)\)")]
_CHANNELS = re.compile(r"to have (\d+) channels, but got (\d+) channels")
# "a multiple of `n_window * 2` (100)": the value in parentheses; else "a multiple of 1920"
_MULTIPLE = [re.compile(r"(?:multiple of|divisible by)[^()\n]{0,40}\((\d+)\)"),
             re.compile(r"(?:multiple of|divisible by) (\d+)")]


def asked(text: str, sizes: set[int]) -> list[tuple[int, int]]:
    """(old, new) pairs the error text asks for, `old` among the layout's `sizes` (after the batch dimension)."""
    out: list[tuple[int, int]] = []
    for pattern in _PAIRS:
        for m in pattern.finditer(text):
            a, b = int(m.group(1)), int(m.group(2))
            out += [(a, b)] if a in sizes else []
            out += [(b, a)] if b in sizes and a not in sizes else []
    for m in _CHANNELS.finditer(text):
        want, got = int(m.group(1)), int(m.group(2))
        out += [(got, want)] if got in sizes else []
    found = _MULTIPLE[0].search(text) or _MULTIPLE[1].search(text)
    n = int(found.group(1)) if found else 0
    if n > 1:
        out += [(v, math.ceil(v / n) * n) for v in sorted(sizes) if v % n]
    return [p for p in dict.fromkeys(out) if p[0] != p[1] and p[1] > 0]


def sizes_of(specs) -> set[int]:
    return {int(d) for _, _, dims in _parsed(specs) for d in dims[1:] if d.isdigit()}


def variants(specs, old: int, new: int) -> list[tuple[str, ...]]:
    """`specs` with `old` set to `new` at each set of its positions (after the batch dimension), smallest sets first."""
    parsed = _parsed(specs)
    where = [(i, j) for i, (_, _, dims) in enumerate(parsed) for j, d in enumerate(dims) if j and d == str(old)]
    if not where or len(where) > MAX_POSITIONS:
        return []
    out = []
    for k in range(1, len(where) + 1):
        for chosen in itertools.combinations(where, k):
            out.append(tuple(_with(parsed, set(chosen), new)))
    return out[:MAX_TRIES]


def _parsed(specs):
    """(prefix 'name=' or '', the rest after the shape ':dtype~fill', the shape's dimensions) per spec."""
    out = []
    for s in specs:
        name, eq, rest = s.partition("=") if "=" in s else ("", "", s)
        shape, colon, tail = rest.partition(":")
        out.append((name + eq, colon + tail, shape.split("x")))
    return out


def _with(parsed, chosen: set, new: int):
    for i, (prefix, tail, dims) in enumerate(parsed):
        yield prefix + "x".join(str(new) if (i, j) in chosen else d for j, d in enumerate(dims)) + tail
