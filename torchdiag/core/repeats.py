"""The same verdict block after block (layer 0, 1, ... 23 of a stack) said once: findings on the same place of
every repeated block of a container (a ModuleList, a Sequential: the indexed components of a path) fold into one
finding on the container that names the blocks and the places. Presentation only: which parameters are flagged,
and why, is decided before; nothing here reads a name for its meaning, only the path's indices."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

MIN_BLOCKS = 2       # a place flagged in one block only is its own finding
PLACES_LISTED = 8    # places inside the blocks a folded finding names (the rest counted)


@dataclass
class Entry:
    key: Any                      # what must be equal to fold (hashable: the verdict and its cause)
    where: str                    # the module or parameter path the finding is on
    members: list[Any]            # what it holds (rows, names)
    # folded: each place inside the blocks ("" = the whole block) with the block paths below the container
    places: list[tuple[str, list[str]]] = field(default_factory=list)

    @property
    def folded(self) -> bool:
        return bool(self.places)

    @property
    def blocks(self) -> list[str]:
        seen = [b for _, bs in self.places for b in bs]
        return sorted(set(seen), key=seen.index)


def split(path: str) -> tuple[str, str, str] | None:
    """'enc.layer.3.attn.q.weight' → ('enc.layer', '3', 'attn.q.weight'), at the first index (a nested stack's
    inner index stays in the place: 'stages.0.blocks.1.conv' → ('stages', '0', 'blocks.1.conv')); None for a
    path without an index."""
    parts = path.split(".")
    first = next((i for i, p in enumerate(parts) if p.isdigit()), None)
    if first is None:
        return None
    return ".".join(parts[:first]), parts[first], ".".join(parts[first + 1:])


def fold(entries: list[Entry]) -> list[Entry]:
    """Entries with the same key on the same place of ≥ MIN_BLOCKS blocks of one container become one finding
    on the container, with the other places so repeated there. Order: where each fold's first entry stood."""
    by_place: dict[tuple, list[int]] = {}
    for i, e in enumerate(entries):
        s = split(e.where)
        if s is not None:
            by_place.setdefault((e.key, s[0], s[2]), []).append(i)
    by_container: dict[tuple, list[tuple[str, list[int]]]] = {}
    for (key, container, place), idx in by_place.items():
        if len(idx) >= MIN_BLOCKS:
            by_container.setdefault((key, container), []).append((place, idx))
    merged: dict[int, Entry] = {}
    absorbed: set[int] = set()
    for (key, container), places in by_container.items():
        idx = sorted(i for _, ii in places for i in ii)
        members = [m for i in idx for m in entries[i].members]
        where = [(p, [split(entries[i].where)[1] for i in ii]) for p, ii in places]   # type: ignore[index]
        merged[idx[0]] = Entry(key, container, members, where)
        absorbed.update(idx)
    return [merged[i] if i in merged else e for i, e in enumerate(entries) if i in merged or i not in absorbed]


def describe(e: Entry, model=None) -> str:
    """'in 24 of the 24 modules of enc.layer (0–23), at attn.q.weight, attn.k.weight' (with each place's blocks
    when they differ)."""
    total = _block_count(model, e.where) if model is not None else None
    of = f" of the {total}" if total is not None else ""
    head = f"in {len(e.blocks)}{of} modules of {e.where or '(root)'}"
    if all(bs == e.places[0][1] for _, bs in e.places):
        places = [p or "the whole module" for p, _ in e.places]
        return f"{head} ({_ranges(e.blocks)}), at " + _cut(places)
    return f"{head} (" + _cut([f"{p or 'the whole module'} in {_ranges(bs)}" for p, bs in e.places]) + ")"


def _cut(items: list[str], limit: int = PLACES_LISTED) -> str:
    return ", ".join(items[:limit]) + (f" … (+{len(items) - limit})" if len(items) > limit else "")


def pattern(e: Entry) -> str:
    """An fnmatch pattern (--allow) for what a folded entry holds: 'enc.layer.*.attn.q.weight' for one place,
    'enc.layer.*.spare.*' for the places under one module, else every block's 'enc.layer.*'."""
    parts = [p.split(".") for p, _ in e.places if p]
    common: list[str] = []
    for column in zip(*parts) if len(parts) == len(e.places) else ():
        if len(set(column)) > 1:
            break
        common.append(column[0])
    deeper = any(len(p) > len(common) for p in parts)
    tail = ".".join(common) + (".*" if deeper and common else "")
    return ".".join(p for p in (e.where, "*", tail) if p)


def _block_count(model, container: str) -> int | None:
    try:
        mod = model.get_submodule(container) if container else model
    except AttributeError:
        return None
    names = [n for n, _ in mod.named_children()]
    return len(names) if names and all(n.isdigit() for n in names) else None


def _ranges(blocks: list[str]) -> str:
    """'0–3, 5, 7–9'."""
    runs: list[list[int]] = []
    for n in sorted(int(b) for b in blocks):
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return ", ".join(f"{a}" if a == b else f"{a}–{b}" for a, b in runs)


def compact(names: list[str], limit: int = 6) -> str:
    """Names, the ones that differ only in their block written once: 'enc.layer.{0–23}.attn.k.bias'."""
    groups: dict[tuple[str, str], list[str]] = {}
    order: list[Any] = []
    for n in names:
        s = split(n)
        if s is None:
            order.append(n)
            continue
        k = (s[0], s[2])
        if k not in groups:
            order.append(k)
        groups.setdefault(k, []).append(s[1])
    out = []
    for k in order:
        if isinstance(k, str):
            out.append(k)
        elif len(groups[k]) == 1:
            out.append(".".join(p for p in (k[0], groups[k][0], k[1]) if p))
        else:
            out.append(".".join(p for p in (k[0], "{" + _ranges(groups[k]) + "}", k[1]) if p))
    return ", ".join(out[:limit]) + (f" … (+{len(out) - limit})" if len(out) > limit else "")
