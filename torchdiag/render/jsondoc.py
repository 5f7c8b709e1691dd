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
    write_whole(to_json(result) + "\n")


def write_whole(text: str) -> None:
    """`text` on stdout, every byte of it. Through the binary layer, in a loop: on an unbuffered stdout
    (python -u, PYTHONUNBUFFERED=1) a write to a full pipe that a signal interrupts returns a short count,
    and the text layer drops the rest without an error (a review: exit 0 with the JSON cut at 64 KiB)."""
    import time

    stream = sys.stdout
    buffer = getattr(stream, "buffer", None)
    if buffer is None:   # a text-only stream (a test's capture): nothing below it to write to
        stream.write(text)
        stream.flush()
        return
    stream.flush()
    view = memoryview(text.encode(getattr(stream, "encoding", None) or "utf-8", getattr(stream, "errors", None) or "strict"))
    while view:
        n = buffer.write(view)
        if n is None:   # a non-blocking stdout that is full: wait for room
            time.sleep(0.01)
            continue
        view = view[n:]
    buffer.flush()
