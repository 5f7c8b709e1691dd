"""What a long diagnostic is doing now: the re-checks on copies of a large model take minutes on a CPU, and a CI
log could not tell them from a hang (a perf review). Diagnostics name their long steps with `doing(text)`; the
CLI's notice (cli/common.still_running) says the innermost one. Torch-free; a stack of strings, nothing else."""
from __future__ import annotations

import contextlib

_STACK: list[str] = []


@contextlib.contextmanager
def doing(text: str):
    _STACK.append(text)
    try:
        yield
    finally:
        _STACK.pop()


def current() -> str | None:
    return _STACK[-1] if _STACK else None
