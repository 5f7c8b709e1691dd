"""Run a Python command line in-process with watching attached: `torchdiag watch -- python train.py ...`.

The script sees what it would see run directly: its own sys.argv, `__name__ == "__main__"`, its folder
first on sys.path (the module's for -m), the caller's working directory, stdin and stdout. Its exception
is a ModelError (exit 3) carrying the report so far; Ctrl-C/SIGTERM keep the partial report (exit
130/143), also where the script's trainer caught it and exited (Lightning's sys.exit(1)); a run with no optimizer step is a UsageError (exit 2)."""
from __future__ import annotations

import os
import re
import sys
import traceback

from ...errors import ModelError, Terminated, UsageError, interrupt_code, one_line

PYTHON = re.compile(r"^python(\d+(\.\d+)?)?(\.exe)?$")
FLAGS_WITH_VALUE = {"-W", "-X", "-Q"}
USAGE_HINT = "torchdiag watch -- python train.py [ARGS...]   (or: -- python -m package.module [ARGS...])"


def parse_command(argv) -> tuple[str, str, list[str]]:
    """("path", script, args) or ("module", name, args); a UsageError for anything else."""
    argv = list(argv)
    if not argv:
        raise UsageError("watch: give the command to run after --", hint=USAGE_HINT)
    first, rest = argv[0], argv[1:]
    if PYTHON.match(os.path.basename(first)) or os.path.abspath(first) == os.path.abspath(sys.executable):
        while rest and rest[0].startswith("-") and rest[0] not in ("-m", "-c", "-"):
            rest = rest[2:] if rest[0] in FLAGS_WITH_VALUE else rest[1:]   # interpreter flags: -u, -O, -W x ...
        if not rest:
            raise UsageError(f"watch: {' '.join(argv)}: no script or -m module to run", hint=USAGE_HINT)
        if rest[0] == "-m":
            if len(rest) < 2:
                raise UsageError("watch: -m needs a module name", hint=USAGE_HINT)
            return "module", rest[1], rest[2:]
        if rest[0] in ("-c", "-"):
            raise UsageError(f"watch: python {rest[0]} is not supported: put the code in a file", hint=USAGE_HINT)
        first, rest = rest[0], rest[1:]
    elif not first.endswith(".py") and not _python_shebang(first):
        raise UsageError(f"watch: {first}: not a Python command (watch runs Python training code in-process)",
                         hint=USAGE_HINT)
    if not os.path.exists(first):
        raise UsageError(f"watch: {first}: no such file", hint="check the script's path (relative to the current folder)")
    if os.path.isdir(first) and not os.path.exists(os.path.join(first, "__main__.py")):
        raise UsageError(f"watch: {first}: a folder without __main__.py", hint=USAGE_HINT)
    return "path", first, rest


def _python_shebang(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            line = f.readline(200)
    except OSError:
        return False
    return line.startswith(b"#!") and b"python" in line


def run_command(argv, watch) -> object:
    """Run the command under `watch` (a diagnostics.watch.Watch not yet entered); return its Result."""
    import runpy

    kind, target, args = parse_command(argv)
    if kind == "module":
        import importlib.util

        sys.path.insert(0, os.getcwd())
        try:
            found = importlib.util.find_spec(target)
        except (ImportError, ValueError):
            found = None
        finally:
            sys.path.pop(0)
        if found is None:
            raise UsageError(f"watch: no module named {target}", hint="run it from the folder that holds the package")
    saved_argv, saved_path, here = sys.argv[:], sys.path[:], os.getcwd()   # here: where the user named the script
    sys.argv = [os.path.abspath(target) if kind == "path" else target, *args]   # run_path sets argv[0] to its path
    sys.path.insert(0, os.path.dirname(os.path.abspath(target)) if kind == "path" else os.getcwd())
    failure = interrupted = error = None
    kept = None   # the script's globals, alive until watch's last read (its models, judged at the end)
    try:
        with watch:
            try:
                if kind == "path":
                    kept = runpy.run_path(os.path.abspath(target), run_name="__main__")   # __file__ absolute, as python gives it
                else:
                    kept = runpy.run_module(target, run_name="__main__", alter_sys=True)
            except SystemExit as exc:
                behind = _interrupt_behind(exc)
                # a trainer's own Ctrl-C handling ends in sys.exit(1) (Lightning's fit); one that saves and exits 0
                # ended as it chose. Not after SIGTERM, which python itself never lets a script see (exit 143: a
                # review's preempted job passed)
                if behind is not None and (isinstance(behind, Terminated) or exc.code not in (None, 0)):
                    raise behind from None
                if exc.code not in (None, 0):   # sys.exit("message") exits 1 after printing the message
                    what = (f"status {int(exc.code)}" if isinstance(exc.code, int)   # True is 1, as Python exits
                            else f"the message {str(exc.code)!r}")
                    failure, error = f"the script exited with {what}", exc
    except KeyboardInterrupt as exc:   # Ctrl-C, or SIGTERM (Terminated): the report so far
        interrupted = interrupt_code(exc)
    except Exception as exc:
        failure, error = one_line(exc), exc
    finally:
        sys.argv[:] = saved_argv
        sys.path[:] = saved_path
        del kept
    result = watch._result
    if result is None and interrupted:   # a second signal before the report's build held them (a review: two within
        result = _built_again(watch, interrupted)   # ~20 ms, exit 4)
    if result is None:   # watch's own end raised (a bug of ours), caught above as the script's: that error, said as
        raise error if error is not None else RuntimeError("watch built no report")   # what it is, not a None here
    if interrupted:
        result.code = int(interrupted)
        result.verdict = f"INTERRUPTED after {watch.engine.step} step(s): the report covers the steps up to then"
        return result
    if failure:
        result.verdict = f"STOPPED at step {watch.engine.step}: the script failed ({failure})"
        raise ModelError(f"the script failed: {failure}", hint=_where(error, watch.engine.step, here),
                         partial=result) from error
    if watch.engine.step == 0 and not watch.engine.scaler_calls:   # every step GradScaler's skipped: the report says
        from . import no_step

        raise no_step(watch.engine, "watch: ")
    return result


def _built_again(watch, interrupted):
    """The report, built once more where a second interrupt cut its first build short (None if it fails again)."""
    from ...core.interrupts import deferred

    result = None
    try:
        with deferred():   # a signal held here is re-raised as the block ends: the report is kept all the same
            result = watch.finish(interrupted=interrupted)
    except BaseException:   # noqa: BLE001 - a third signal, or the engine half-closed: no report, as before
        pass
    return result


def _interrupt_behind(exc: BaseException) -> KeyboardInterrupt | None:
    """The Ctrl-C (or SIGTERM) a SystemExit was raised while handling, if any: Lightning catches KeyboardInterrupt,
    shuts down and calls sys.exit(1) (a sweep: an interrupted Trainer.fit under watch was "the script failed", exit 3)."""
    seen = exc.__context__
    for _ in range(16):   # a chain, not a cycle: bounded anyway
        if seen is None or isinstance(seen, KeyboardInterrupt):
            return seen
        seen = seen.__context__
    return None


def _where(exc, steps: int = 1, here: str | None = None) -> str:
    """The innermost frame of the user's code in the traceback (file:line in function); a SyntaxError's own file
    and line (its traceback is runpy's compile). Paths relative to `here`, the folder the script was named from (it
    may have changed folder since: a review)."""
    report = f"; the report covers the {steps} step(s) before it" if steps else " (before any training step)"
    if isinstance(exc, SyntaxError) and exc.filename:
        return f"in {_shown(exc.filename, here)}, line {exc.lineno}" + report
    frames = traceback.extract_tb(exc.__traceback__) if exc is not None else []
    ours = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    user = [f for f in frames if not f.filename.startswith(ours) and "runpy" not in f.filename
            and "/torch/" not in f.filename.replace("\\", "/")]
    f = (user or frames or [None])[-1]
    return f"raised at {_shown(f.filename, here)}:{f.lineno} in {f.name}" + report if f else report.lstrip("; ")


def _shown(path: str, here: str | None = None) -> str:
    """A file under `here` (the working folder) as a relative path, as the user named the script (its __file__ is
    absolute)."""
    try:
        rel = os.path.relpath(path, here or os.getcwd())
    except ValueError:   # another drive (Windows)
        return path
    return rel if not rel.startswith(os.pardir) else path
