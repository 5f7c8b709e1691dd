"""A MODEL_SPEC checked before torch is imported: a missing file or a factory the file certainly does not
define is a usage error in milliseconds, not after the seconds `import torch` takes. Torch-free.

Only what can be known without running the user's code is refused: the file exists and is a .py file,
and its top level (read with `ast`, never executed) binds the factory's name. A file that can bind names
we cannot see (`from m import *`, a module-level `__getattr__`, `globals()`) is left to the import."""
from __future__ import annotations

import ast
import difflib
import os

from ..errors import UsageError

MAX_SOURCE = 16 * 2 ** 20     # a larger "model file" is left to Python's own import


def precheck(spec: str, download: str | None = None) -> None:
    """Raise the UsageError the full load would raise, where it can be known now; else return. `download`:
    --download (an hf:NAME missing from the Hugging Face cache may then be fetched)."""
    from .sources import is_source

    if spec.startswith("hf:") and spec[3:]:
        from .hub import precheck as hub_precheck

        hub_precheck(spec[3:], download)
        return
    if is_source(spec) or ":" not in spec:
        return
    where, _, name = spec.rpartition(":")
    if not where or not name or not (where.endswith(".py") or "/" in where or os.sep in where):
        return                                 # dotted modules: finding them imports their parents
    path = os.path.abspath(where)
    if not os.path.exists(path):
        raise file_not_found(where)
    if not os.path.isfile(path) or not where.endswith(".py") or os.path.getsize(path) > MAX_SOURCE:
        return                                 # folders and other files: the loader says what they are
    plain: set[str] = set()
    names = top_level_names(path, plain)
    first = name.split(".", 1)[0]
    if names is None or first in names:
        return
    # a module the file imports (torch) or a literal (SEED = 0), bound to nothing else, is no factory to suggest
    raise no_factory(where, name, sorted(n for n in names - plain if not n.startswith("_")))


def file_not_found(where: str, what: str = "model file") -> UsageError:
    return UsageError(f"{what} not found: {where}", hint="check the path before the ':'")


def no_factory(where: str, name: str, candidates: list[str]) -> UsageError:
    """The factory is not there: the names that are, nearest first."""
    close = difflib.get_close_matches(name.split(".", 1)[0], candidates, n=3, cutoff=0.5)
    # functions (lower case, the usual factories) before classes, which an ASCII sort puts first (a review)
    ranked = sorted(candidates, key=lambda n: (n[:1].isupper(), n))
    more = f" … (+{len(ranked) - 8})" if len(ranked) > 8 else ""
    hint = f"did you mean {', '.join(close)}?" if close else (
        f"callables there: {', '.join(ranked[:8])}{more}" if candidates else None)
    return UsageError(f"'{where}' has no factory named '{name}'", hint=hint)


def top_level_names(path: str, plain: set[str] | None = None) -> set[str] | None:
    """The names the module's top level binds, or None when that cannot be told without running it. `plain` gets
    those that are no factory: bound by `import X` (modules, not things imported from them) or to a literal."""
    try:
        with open(path, "rb") as f:
            tree = ast.parse(f.read(), filename=path)
    except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):
        return None                            # the import reports it with the user's own traceback
    names: set[str] = set()
    only: set[str] = set()   # bound to a module or a literal somewhere
    other: set[str] = set()  # bound to anything else somewhere (a def after `build = None`: a review)
    if not _bind(tree.body, names, only, other):
        return None
    if plain is not None:
        plain.update(only - other)
    return names


def _bind(body: list, names: set[str], only: set[str], other: set[str]) -> bool:
    """Add what `body` binds; False when something binds names we cannot see."""
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if node.name == "__getattr__":
                return False
            names.add(node.name)
            other.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name == "*":
                    return False
                bound = alias.asname or alias.name.split(".", 1)[0]
                names.add(bound)
                (only if isinstance(node, ast.Import) else other).add(bound)
        else:
            if any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in ("globals", "exec", "vars")
                   for n in ast.walk(node)):
                return False
            stored = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
            names.update(stored)
            # SEED = 0, A, B = 0, 1, CFG = {...}: literals; anything else (build = make, a loop target) may be one
            (only if _literal(node) else other).update(stored)
            for block in ("body", "orelse", "finalbody", "handlers"):
                inner = getattr(node, block, None)
                if isinstance(inner, list) and not _bind(inner, names, only, other):
                    return False
    return True


def _literal(node) -> bool:
    """An assignment of a literal (a number, a string, a container of them) at the top level."""
    value = getattr(node, "value", None) if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
    if value is None:
        return False
    try:
        ast.literal_eval(value)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False
    return True
