"""How a run ended: the one ladder from an exception to an exit code, a message, a hint and the partial
result, written once for the one-process run and for each rank under torchrun. The runner never prints:
the CLI shows an Outcome (cli/common.show). Torch-free."""
from __future__ import annotations

import traceback
from dataclasses import dataclass, field
from typing import Any

from ..errors import (
    HOST_OOM_HINT,
    DiagError,
    ExitCode,
    OptionError,
    device_error,
    host_out_of_memory,
    interrupt_code,
    one_line,
)
from .isolation import UserExit

BUG_HINT = "this is a bug in torchdiag: run again with --debug and please report the traceback"


@dataclass
class Outcome:
    """What the caller shows: the result (with the files written for it), or the error with its partial."""

    code: int = ExitCode.OK
    result: Any = None                     # the Result rendered (merged over ranks under torchrun)
    written: dict = field(default_factory=dict)   # kind -> path of the files written for it
    logs: str | None = None             # the TensorBoard folder written for it
    message: str | None = None          # the error, None when the run produced its result
    hint: str | None = None
    partial: Any = None                    # what ran before the failure (a Result), shown with the error
    trace: str | None = None            # the traceback, shown under --debug
    lines: list = field(default_factory=list)   # stderr lines to show first (`error: [rank N] …`)
    quiet: bool = False                    # show nothing: another rank reports (torchrun, ranks other than 0)
    document: dict = field(default_factory=dict)   # more keys for the --json error document


def failed(exc: BaseException, ctx=None, caller: str = "cli") -> Outcome:
    """The ladder. A DiagError is ours to explain (named for `caller`, with the context's facts and what ran
    before it); Ctrl-C/SIGTERM an interrupt; SystemExit and other BaseExceptions in here come from the user's
    code (exit 3); any other Exception is a torchdiag bug (exit 4)."""
    if isinstance(exc, DiagError):
        if isinstance(exc, OptionError):
            exc.name_for(caller)
        if ctx is not None:
            ctx.explain(exc)
        partial = getattr(exc, "partial", None)
        if partial is not None and ctx is not None:
            ctx.finish(partial)
        return Outcome(exc.code, message=exc.message, hint=exc.hint, partial=partial, trace=traceback.format_exc())
    if isinstance(exc, KeyboardInterrupt):   # Ctrl-C, or SIGTERM (Terminated)
        code = interrupt_code(exc)
        return Outcome(code, message="interrupted" if code == ExitCode.INTERRUPTED else "terminated (SIGTERM)")
    if isinstance(exc, UserExit):
        return Outcome(ExitCode.MODEL, message=f"your code called {exc.code}",
                       hint="torchdiag runs your module's code (the model, data, loss or batch factory and what they "
                            "call); keep os._exit out of import time, factories and forward")
    if isinstance(exc, SystemExit):   # only the user's code calls sys.exit in here
        return Outcome(ExitCode.MODEL, message=f"your code called sys.exit({exc.code!r})",
                       hint="torchdiag runs your module's code (the model, data, loss or batch factory and what they "
                            "call); keep sys.exit out of import time, factories and forward")
    gpu = device_error(exc) if isinstance(exc, Exception) else None
    if gpu is not None:   # the GPU's own failure (an assert of the model's kernels surfaces at whatever call is next)
        return Outcome(gpu.code, message=gpu.message, hint=gpu.hint, trace=traceback.format_exc())
    if isinstance(exc, Exception) and host_out_of_memory(exc):   # the host's memory (MemoryError, the CPU allocator)
        return Outcome(ExitCode.MODEL, message=f"out of memory: {one_line(exc)}", hint=HOST_OOM_HINT,
                       trace=traceback.format_exc())
    if isinstance(exc, Exception):   # a bug of ours
        return Outcome(ExitCode.INTERNAL, message=f"internal error in torchdiag: {one_line(exc)}", hint=BUG_HINT,
                       trace=traceback.format_exc())
    # only the user's code raises other BaseException subclasses
    return Outcome(ExitCode.MODEL, message=f"the model's own code raised {one_line(exc)}",
                   hint="a BaseException that is not an Exception stops any program; raise an Exception subclass",
                   trace=traceback.format_exc())


def produced(job, result, written: dict | None = None, after: bool = True) -> Outcome:
    """The result's Outcome once its files are written: the caller's step on them (`job.after`, e.g. a
    path added to the result), then its TensorBoard events; before anything goes to stdout."""
    from ..render import write_tensorboard

    written = dict(written or {})
    if job.after is not None and after:
        job.after(result, written)
    return Outcome(int(result.exit_code), result=result, written=written, logs=write_tensorboard(result, job.render_spec()))
