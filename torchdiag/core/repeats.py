"""The same verdict block after block (layer 0, 1, ... 23 of a stack) said once: findings on the same place of
every repeated block of a container (a ModuleList, a Sequential: the indexed components of a path) fold into one
finding on the container that names the blocks and the places. Presentation only: which parameters are flagged,
and why, is decided before; nothing here reads a name for its meaning, only the path's indices, or, in a model
whose paths have none, the blocks that are numbered (b1, b2, …: siblings of one class and one prefix)."""
from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field
from typing import Any

MIN_BLOCKS = 2       # a place flagged in one block only is its own finding
PLACES_LISTED = 8    # places inside the blocks a folded finding names (the rest counted)
RUNS_LISTED = 8      # runs of block numbers written out (0–3, 5, 7–9, ...; the rest counted)
LEVELS = 3           # nested stacks: folded at the outer index first, what is left at the next one


@dataclass
class Entry:
    key: Any                      # what must be equal to fold (hashable: the verdict and its cause)
    where: str                    # the module or parameter path the finding is on
    members: list[Any]            # what it holds (rows, names)
    # folded: each place inside the blocks ("" = the block itself) with the block numbers below the container
    places: list[tuple[str, list[str]]] = field(default_factory=list)

    @property
    def folded(self) -> bool:
        return bool(self.places)

    @property
    def blocks(self) -> list[str]:
        seen = [b for _, bs in self.places for b in bs]
        return sorted(set(seen), key=_number)


def _index(part: str) -> bool:
    """A container's index as torch writes it: ASCII digits, no leading zero (a ModuleDict key "01" or "²" is
    a name)."""
    return part.isascii() and part.isdigit() and (part == "0" or not part.startswith("0"))


NUMBERED = re.compile(r"([A-Za-z_]+?)(0|[1-9][0-9]*)")


def _number(block: str) -> tuple[str, int]:
    """'7' → ('', 7), 'b7' → ('b', 7): a block's prefix and number, to sort and to write runs."""
    m = NUMBERED.fullmatch(block)
    return (m.group(1), int(m.group(2))) if m else ("", int(block))


def named_blocks(model) -> frozenset[str]:
    """The paths of the numbered blocks of a stack written without a container (timm RegNet's s4.b1 … s4.b7):
    ≥ MIN_BLOCKS children of one module, of one class, made of modules holding parameters, named one prefix and
    a number (a CNN's conv1 and conv2 are layers, not blocks)."""
    if model is None:
        return frozenset()
    out: set[str] = set()
    for path, mod in model.named_modules():
        runs: dict[tuple[str, type], list[str]] = {}
        for n, c in mod.named_children():
            m = NUMBERED.fullmatch(n)
            if m and any(True for _ in c.children()) and any(True for _ in c.parameters()):
                runs.setdefault((m.group(1), type(c)), []).append(n)
        prefixes = [p for p, _ in runs]
        for (p, _), names in runs.items():
            if len(names) >= MIN_BLOCKS and prefixes.count(p) == 1:     # one prefix, two classes: not one stack
                out.update(f"{path}.{n}" if path else n for n in names)
    return frozenset(out)


def split(path: str, level: int = 0, named: frozenset[str] = frozenset()) -> tuple[str, str, str] | None:
    """'enc.layer.3.attn.q.weight' → ('enc.layer', '3', 'attn.q.weight'), at the path's `level`-th index (a nested
    stack: 'stages.0.blocks.1.conv' → ('stages', '0', 'blocks.1.conv') at 0, ('stages.0.blocks', '1', 'conv') at
    1); None for a path without that many indices. A path with no index counts the `named` blocks on it
    (named_blocks) as indices: 's4.b7.conv3.bn' → ('s4', 'b7', 'conv3.bn') at 1."""
    parts = path.split(".")
    idx = [i for i, p in enumerate(parts) if _index(p)]
    if not idx and named:
        # not the path's end: a whole block is no place in it (gradflow's "one of s3.b3, s3.b4" gates are on s3)
        idx = [i for i in range(len(parts) - 1) if ".".join(parts[:i + 1]) in named]
    if len(idx) <= level:
        return None
    at = idx[level]
    return ".".join(parts[:at]), parts[at], ".".join(parts[at + 1:])


def fold(entries: list[Entry], model=None) -> list[Entry]:
    """Entries with the same key on the same place of ≥ MIN_BLOCKS blocks of one container become one finding
    on the container, with the other places so repeated there; nested stacks outer index first. Order: where
    each fold's first entry stood. With the `model`, numbered blocks count where a path has no index."""
    out, named = list(entries), named_blocks(model)
    for level in range(LEVELS):
        out = _fold_at(out, level, named)
    return out


def _fold_at(entries: list[Entry], level: int, named: frozenset[str]) -> list[Entry]:
    by_place: dict[tuple, list[int]] = {}
    for i, e in enumerate(entries):
        s = None if e.folded else split(e.where, level, named)
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
        where = [(p, [split(entries[i].where, level, named)[1] for i in ii])   # type: ignore[index]
                 for p, ii in places]
        merged[idx[0]] = Entry(key, container, members, where)
        absorbed.update(idx)
    return [merged[i] if i in merged else e for i, e in enumerate(entries) if i in merged or i not in absorbed]


def describe(e: Entry, model=None) -> str:
    """'in 24 of the 24 modules of enc.layer (0–23), at attn.q.weight, attn.k.weight' (with each place's blocks
    when they differ: '(lin.weight in 0–2, 4; lin.bias in 0–3)')."""
    total = _block_count(model, e.where) if model is not None else None
    of = f" of the {total}" if total is not None else ""
    kind = "entries" if any(not p for p, _ in e.places) else "modules"
    head = f"in {len(e.blocks)}{of} {kind} of {e.where or '(root)'}"
    if all(bs == e.places[0][1] for _, bs in e.places):
        return f"{head} ({ranges(e.blocks)}), at " + cut([p or "the entry itself" for p, _ in e.places], ", ")
    return f"{head} (" + cut([f"{p or 'the entry itself'} in {ranges(bs)}" for p, bs in e.places], "; ") + ")"


def cut(items: list[str], sep: str, limit: int = PLACES_LISTED) -> str:
    return sep.join(items[:limit]) + (f"{sep}… (+{len(items) - limit} more)" if len(items) > limit else "")


def pattern(e: Entry, names: list[str]) -> str | None:
    """An fnmatch pattern (--allow) that matches what a folded entry holds and none of the other `names` (every
    parameter of the model), else None: 'enc.layer.*.attn.q.weight' for one place, 'enc.layer.*.spare.*' for
    the places under one module."""
    held = {m if isinstance(m, str) else m["name"] for m in e.members}
    parts = [p.split(".") for p, _ in e.places]
    common: list[str] = []
    for column in zip(*parts):
        if len(set(column)) > 1:
            break
        common.append(column[0])
    deeper = any(len(p) > len(common) for p in parts)
    if not common:
        return None     # 'container.*' would hold every block's everything
    pat = ".".join(p for p in (e.where, "*", ".".join(common) + (".*" if deeper else "")) if p)
    if not all(fnmatch.fnmatchcase(n, pat) for n in held) or any(
            fnmatch.fnmatchcase(n, pat) for n in names if n not in held):
        return None     # it would also accept parameters this finding does not cover
    return pat


def _block_count(model, container: str) -> int | None:
    try:
        mod = model.get_submodule(container) if container else model
    except AttributeError:
        return None
    children = list(mod.named_children())
    names = [n for n, _ in children] or [n for n, _ in mod.named_parameters(recurse=False)]
    numbered = named_blocks(model)
    if not (names and (all(_index(n) for n in names) or
                       all((f"{container}.{n}" if container else n) in numbered for n in names))):
        return None
    # blocks that hold parameters: a Sequential's activations are no place a parameter finding could be (a sweep:
    # "in 6 of the 12 modules of body", the 12 counting its ReLUs)
    holding = [n for n, c in children if any(True for _ in c.parameters())]
    return len(holding) if children and holding else len(names)


def ranges(blocks: list[str], limit: int = RUNS_LISTED) -> str:
    """'0–3, 5, 7–9' or 'b1–b7' (the first `limit` runs; the rest counted)."""
    runs: list[list] = []
    for p, n in sorted(_number(b) for b in blocks):
        if runs and (p, n) == (runs[-1][0], runs[-1][2] + 1):
            runs[-1][2] = n
        else:
            runs.append([p, n, n])
    said = [f"{p}{a}" if a == b else f"{p}{a}–{p}{b}" for p, a, b in runs]
    left = sum(b - a + 1 for _, a, b in runs[limit:])
    return ", ".join(said[:limit]) + (f", … (+{left} more)" if left else "")


def common_path(names: list[str]) -> str:
    """The dotted path every name starts with, whole components only ('' for none): where a finding over several
    parameters or modules is."""
    from os.path import commonprefix

    return ".".join(commonprefix([n.split(".") for n in names]))


def compact(names: list[str], limit: int = 6) -> str:
    """Names, the ones that differ only in their outer index written once: 'enc.layer.{0–23}.attn.k.bias' (the
    first `limit` items; the names left out counted)."""
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
    out, counts = [], []
    for k in order:
        if isinstance(k, str):
            out.append(k)
            counts.append(1)
            continue
        blocks = groups[k]
        idx = blocks[0] if len(blocks) == 1 else "{" + ranges(blocks) + "}"
        out.append(".".join(p for p in (k[0], idx, k[1]) if p))
        counts.append(len(blocks))
    left = sum(counts[limit:])
    return ", ".join(out[:limit]) + (f" … (+{left} more)" if left else "")
