"""Exit codes and the one exception type that carries a user-facing message (stdlib only)."""
from __future__ import annotations

import enum
import re
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


def caused_by(exc: BaseException | None, kinds) -> bool:
    """`exc`, or an exception in its chain (what raised it, or what it was raised while handling), is one of `kinds`."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, kinds):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


def out_of_memory(exc: BaseException | None) -> bool:
    """`exc` or what raised it ran out of memory: a MemoryError, a GPU's OOM, or the CPU allocator's refusal (a
    RuntimeError "can't allocate memory", under a worker's address-space cap)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, MemoryError) or _gpu_kind(exc) == "oom" or "can't allocate memory" in one_line(exc, 10**4):
            return True
        exc = exc.__cause__
    return False


HOST_OOM_HINT = ("the run needs more memory than the machine has available: a smaller batch (-i) or model (--arg), "
                 "--dtype bfloat16, or --device meta for summary, flops and memory")


def host_out_of_memory(exc: BaseException) -> bool:
    """`exc` itself is the host running out of memory: a MemoryError (not a subclass: a library's quota error is one)
    or the CPU allocator's refusal. Not its causes: our own error raised over one is ours (a review)."""
    return type(exc) is MemoryError or (isinstance(exc, RuntimeError)
                                        and "DefaultCPUAllocator: can't allocate memory" in one_line(exc, 10**4))


def one_line(exc: BaseException, limit: int = 300) -> str:
    """`TypeName: first line of the message`, cut to `limit` characters (even when str(exc) raises)."""
    try:   # a terminal's colour codes left out (torch's weights-only refusal bolds words: a review)
        text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc)).strip().splitlines()
    except Exception:
        text = ["(its message could not be printed)"]
    first = text[0] if text else ""
    out = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    return out if len(out) <= limit else out[: limit - 1] + "…"


# A GPU's own failures (torch.AcceleratorError, torch.OutOfMemoryError, or the RuntimeError older torch raised),
# told by class name and message so this module stays stdlib-only. CUDA reports a kernel's failure at a later call,
# often one of torchdiag's, and code may re-raise it wrapped (`raise … from exc`): an explicit cause is followed;
# an error merely raised while one was being handled is its own (a fallback's shape bug, a handler's KeyError).
KERNEL_TYPES = ("AcceleratorError",)
KERNEL_PREFIXES = ("CUDA error", "CUDA driver error", "cuDNN error", "HIP error", "Triton Error [CUDA]")
OOM_TYPES = ("OutOfMemoryError",)
OOM_PREFIXES = ("CUDA out of memory", "CUDA error: out of memory", "HIP out of memory",
                "CUDA error: CUBLAS_STATUS_ALLOC_FAILED")
DEVICE_HINT = ("CUDA reports a kernel's failure at a later call, so where it surfaced does not name the op that "
               "failed: run again with --device cpu (the same error, raised where it happens) or with "
               "CUDA_LAUNCH_BLOCKING=1; a device-side assert is most often an index out of range (token ids past "
               "the vocabulary, a class target past the classes)")
OOM_HINT = ("the step needs more memory than the device has free: a smaller batch (-i) or --dtype bfloat16; "
            "`torchdiag memory` estimates a step's peak without running out")


def _gpu_kind(exc: BaseException) -> str | None:
    """Of one exception (torch's AcceleratorError and OutOfMemoryError are RuntimeErrors)."""
    if type(exc).__name__ in OOM_TYPES:
        return "oom"
    if not isinstance(exc, RuntimeError):
        return None
    text = one_line(exc).partition(": ")[2]
    if text.startswith(OOM_PREFIXES):
        return "oom"
    return "kernel" if type(exc).__name__ in KERNEL_TYPES or text.startswith(KERNEL_PREFIXES) else None


def device_failure(exc: BaseException | None) -> str | None:
    """'oom', 'kernel' or None: is `exc`, or the exception it was explicitly raised from (`raise … from`), a GPU's
    own failure? An exception merely raised while handling one is not (its __context__ is not followed)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen and len(seen) < 16:
        seen.add(id(exc))
        kind = _gpu_kind(exc)
        if kind is not None:
            return kind
        exc = exc.__cause__
    return None


def device_error(exc: BaseException, where: str = "") -> ModelError | None:
    """The ModelError (exit 3) a GPU's own failure becomes, with its hint; None for any other exception."""
    kind = device_failure(exc)
    if kind is None:
        return None
    at = f" (surfaced in {where})" if where else ""
    if kind == "oom":
        return ModelError(f"out of GPU memory{at}: {one_line(exc)}", hint=OOM_HINT)
    return ModelError(f"a CUDA kernel failed{at}: {one_line(exc)}", hint=DEVICE_HINT)


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

    def __init__(self, field: str, problem: str, hint: str | None = None, flag: str | None = None,
                 others: tuple[str, ...] = ()):
        # `others`: other options the problem or hint names, renamed with it (`must be above --min-lr`)
        self.field, self.problem, self.flag, self.others, self.raw_hint = field, problem, flag, others, hint
        super().__init__(self._text("python"), hint)

    def _text(self, caller: str) -> str:
        name = self.flag if caller == "cli" and self.flag else option_name(self.field, caller)
        return f"{name}: {self._renamed(self.problem, caller)}"

    def _renamed(self, text: str, caller: str) -> str:
        for other in self.others:
            text = text.replace(other, option_name(other, caller))
        return text

    def name_for(self, caller: str) -> OptionError:
        self.message = self._text(caller)
        self.args = (self.message,)
        if self.raw_hint:
            self.hint = self._renamed(self.raw_hint, caller)
        return self
