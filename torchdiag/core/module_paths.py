"""Module and parameter paths: owners, ancestors, display labels."""
from __future__ import annotations


def owner(name: str) -> str:
    """The module path of a parameter (or the parent of a module): 'a.b.weight' → 'a.b'."""
    return name.rpartition(".")[0]


def ancestors(path: str) -> list[str]:
    """'a.b.c' → ['a.b.c', 'a.b', 'a', ''] (innermost first)."""
    out = [path]
    while path:
        path = owner(path)
        out.append(path)
    return out


def label(path: str) -> str:
    return path or "(root)"
