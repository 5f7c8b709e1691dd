"""`--json`: exactly one JSON document on stdout."""
from __future__ import annotations

import json
import math
import sys


def _clean(obj):
    if isinstance(obj, float):
        if math.isnan(obj):
            return "nan"
        if math.isinf(obj):
            return "inf" if obj > 0 else "-inf"
        return obj
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if obj is None or isinstance(obj, (str, int, bool)):
        return obj
    return str(obj)


def to_json(result) -> str:
    return json.dumps(_clean(result.to_dict()), indent=2)


def print_json(result) -> None:
    sys.stdout.write(to_json(result) + "\n")
    sys.stdout.flush()
