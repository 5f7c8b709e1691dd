"""Exit codes and the one exception type that carries a user-facing message (stdlib only)."""
from __future__ import annotations

import enum
from typing import Any


class ExitCode(enum.IntEnum):
    OK = 0            # ran; nothing failed
    CHECK_FAILED = 1  # ran; a check failed
    USAGE = 2         # bad option, spec, input shape, missing file, unavailable device
    MODEL = 3         # the user's model raised (import, factory, forward, backward, step)
    INTERNAL = 4      # a bug in torchdiag
    INTERRUPTED = 130  # Ctrl-C
    TERMINATED = 143   # SIGTERM


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C would be: code that keeps a partial result on Ctrl-C keeps it here too."""

    code = ExitCode.TERMINATED


def interrupt_code(exc: BaseException) -> ExitCode:
    """130 for Ctrl-C, 143 for SIGTERM."""
    return getattr(exc, "code", ExitCode.INTERRUPTED) if isinstance(exc, Terminated) else ExitCode.INTERRUPTED


class DiagError(Exception):
    """An error the CLI shows as `error: message` / `hint: hint` and exits with `code`."""

    code = ExitCode.INTERNAL
    partial: Any = None   # a partial Result shown before the error (ModelError takes it; watch's merge sets it)

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
    follows_peer: bool   # set (only) where a peer rank's failure is what this rank saw; read with getattr

    def __init__(self, message: str, hint: str | None = None, partial=None):
        super().__init__(message, hint)
        self.partial = partial


def one_line(exc: BaseException, limit: int = 300) -> str:
    """`TypeName: first line of the message`, cut to `limit` characters (even when str(exc) raises)."""
    try:
        text = str(exc).strip().splitlines()
    except Exception:
        text = ["(its message could not be printed)"]
    first = text[0] if text else ""
    out = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    return out if len(out) <= limit else out[: limit - 1] + "…"


CALLERS = ("cli", "python", "config")


def option_name(field: str, caller: str = "python") -> str:
    """An option in the caller's own terms: `--target-ratio` on the command line, `target_ratio` in
    Python, `target-ratio` in pyproject.toml."""
    if caller == "cli":
        return "--" + field.replace("_", "-")
    if caller == "config":
        return field.replace("_", "-")
    return field


class OptionError(UsageError):
    """A bad option value, found when Options are built (before any model is loaded). The message
    names the option for the caller: `name_for("cli")` renames it before it is shown."""

    def __init__(self, field: str, problem: str, hint: str | None = None, flag: str | None = None):
        self.field, self.problem, self.flag = field, problem, flag
        super().__init__(self._text("python"), hint)

    def _text(self, caller: str) -> str:
        name = self.flag if caller == "cli" and self.flag else option_name(self.field, caller)
        return f"{name}: {self.problem}"

    def name_for(self, caller: str) -> OptionError:
        self.message = self._text(caller)
        self.args = (self.message,)
        return self
