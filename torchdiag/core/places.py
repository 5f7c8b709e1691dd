"""Where a finding is in the model, so findings read most severe first, then in model order."""
from __future__ import annotations

import re

from ..results import SEVERITIES

_NAME = re.compile(r"[^\s,(:]+")


def model_places(model) -> dict[str, int]:
    """Every module and parameter name, in registration order (a parameter right after its module)."""
    places: dict[str, int] = {}
    for name, module in model.named_modules():
        if name:
            places.setdefault(name, len(places))
        for pname, _ in module.named_parameters(prefix=name, recurse=False):
            places.setdefault(pname, len(places))
    return places


def place(where: str, places: dict[str, int]) -> int:
    """The place of the first name in `where` ("features.3 (Conv2d)", "head.weight, fc.bias"), or of its
    nearest enclosing module. What names no part of the model (inputs, the loss) and the whole model
    ("": a consequence such as cannot-overfit) come after every part, so a located cause reads first."""
    match = _NAME.match(where or "")
    name = match.group(0) if match else ""
    while name:
        if name in places:
            return places[name]
        name = name.rpartition(".")[0]
    return len(places) + (1 if not where else 0)


def sort_findings(findings: list, places: dict[str, int] | None) -> list:
    """Errors first, then warnings, then info; within one severity in model order (stable otherwise)."""
    rank = {s: i for i, s in enumerate(SEVERITIES)}
    return sorted(findings, key=lambda f: (rank.get(f.severity, len(rank)),
                                           place(f.where, places) if places else 0))
