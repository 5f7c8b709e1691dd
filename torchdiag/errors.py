"""Exit codes and the one exception type that carries a user-facing message (stdlib only)."""
from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    OK = 0            # ran; nothing failed
    CHECK_FAILED = 1  # ran; a check failed
    USAGE = 2         # bad option, spec, input shape, missing file, unavailable device
    MODEL = 3         # the user's model raised (import, factory, forward, backward, step)
    INTERNAL = 4      # a bug in torchdiag
    INTERRUPTED = 130


class DiagError(Exception):
    """An error the CLI shows as `error: message` / `hint: hint` and exits with `code`."""

    code = ExitCode.INTERNAL

    def __init__(self, message: str, hint: str | None = None, code: ExitCode | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint
        if code is not None:
            self.code = code


class UsageError(DiagError):
    code = ExitCode.USAGE


class ModelError(DiagError):
    """The user's code raised. `partial` may hold a partial result to show before the error."""

    code = ExitCode.MODEL

    def __init__(self, message: str, hint: str | None = None, partial=None):
        super().__init__(message, hint)
        self.partial = partial


def one_line(exc: BaseException, limit: int = 300) -> str:
    """`TypeName: first line of the message`, cut to `limit` characters."""
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    out = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    return out if len(out) <= limit else out[: limit - 1] + "…"
