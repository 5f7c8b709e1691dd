"""The CLI's part of a command: its Typer signature built from the registry (commands.py: the run-wide
option groups it takes, their spellings and help) plus its own options; a runner Job built from what was
typed; and the printing of the runner's Outcome (result, error lines, the --json error document)."""
from __future__ import annotations

import contextlib
import inspect
import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Annotated, Optional

import typer

from ..commands import RUN, get

_TYPES = {"str": str, "int": int, "float": float, "bool": bool, "toggle": bool, "path": Optional[Path],
          "strs": Optional[list[str]]}


def nonempty_path(text) -> Path:
    """A path option's parser: "" is refused, not taken as Path("") = "." (a review: `--checkpoint ""` said ". is a
    folder", a path the user never typed)."""
    if not str(text).strip():
        raise typer.BadParameter("an empty path")
    return Path(text)


def option(name: str, **override):
    """The Typer annotation of run-wide option `name`, as commands.RUN_OPTIONS spells it."""
    o = RUN[name]
    kind = _TYPES[o.type]
    if o.type in ("str", "int", "float") and o.default is None:
        kind = Optional[kind]
    kw = {"help": o.help, "metavar": o.metavar, **override}
    if o.metavar is None:
        kw.pop("metavar")
    if o.type in ("strs", "path") or (o.default is None and o.metavar):
        kw.setdefault("show_default", False)
    if o.type == "path":
        kw.setdefault("parser", nonempty_path)
    return Annotated[kind, typer.Option(*o.flags, **kw)]


Spec = Annotated[str, typer.Argument(metavar="MODEL_SPEC", show_default=False,
                                     help="path/to/file.py:factory or dotted.module:factory (split on the last ':'); "
                                          "or torchvision:NAME, timm:NAME, hf:FOLDER, hf:ORG/NAME (Hugging Face cache).")]
Depth = Annotated[int, typer.Option("--depth", help="Module nesting depth shown in tables (≥ 0).")]


def momentum(default: str):
    """--momentum of the commands that train with --optimizer sgd (None: the command's own default)."""
    return Annotated[float | None, typer.Option("--momentum", show_default=False,
                                                help=f"SGD's momentum, 0 ≤ M < 1 (with --optimizer sgd only). Default: {default}.")]
Args, Inputs, Checkpoint, Json, Tb, Debug = (option(n) for n in ("args", "inputs", "checkpoint", "json", "tb", "debug"))


def register(app, name: str, body: Callable, own: dict, details: str, epilog: str, target=Spec, **settings) -> None:
    """Command `name`: its target argument, then the run-wide options of its groups with its own options
    (`own`: param -> (annotation, default), in --help order) before --seed. `body(o)` gets every value by parameter name.
    Its help is the registry's summary and then `details`; `settings` go to Typer's app.command."""
    command = get(name)
    run_wide = [(field, option(field), command.defaults.get(field, RUN[field].default)) for field in command.options()]
    at = next((i for i, (field, _, _) in enumerate(run_wide) if field == "seed"), len(run_wide))
    own_params = [(param, annotation, default) for param, (annotation, default) in own.items()]
    params = [inspect.Parameter("spec", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=target)]
    for param, annotation, default in run_wide[:at] + own_params + run_wide[at:]:
        params.append(inspect.Parameter(param, inspect.Parameter.KEYWORD_ONLY, annotation=annotation, default=default))

    def callback(**given) -> None:
        body(SimpleNamespace(**given))

    callback.__signature__ = inspect.Signature(params)
    callback.__annotations__ = {}
    callback.__name__ = command.module_name
    app.command(name, help=f"{command.summary}\n\n{details}", epilog=epilog, no_args_is_help=True, **settings)(callback)


def job(name: str, o, *, optimizer: dict | None = None, outputs: dict | None = None, needs_inputs: bool = True, **hooks):
    """The runner's Job from what was typed (`o`: every parameter of the command)."""
    from ..runner.job import Job

    command = get(name)
    fields = {f: getattr(o, f) for f in command.options()}
    fields["model"] = o.spec or ""
    if optimizer is not None:
        fields["optimizer"] = optimizer
    if not needs_inputs:
        fields["needs_inputs"] = False
    return Job(command, fields, dict(outputs or {}), progress=lambda message: progress(message, bool(o.json)),
               working=still_running, **hooks)


def execute(job, render_extra: Callable | None = None) -> None:
    """Run the job (runner/local.py) with `render_extra(result, written)` as its step after the files, show
    its outcome, exit with its code."""
    from ..runner.isolation import Finishing
    from ..runner.local import execute as run

    job.after = render_extra
    job.show = lambda outcome: show(outcome, job)   # a rank blocked when interrupted reports from another thread
    outcome = run(job)
    finishing = Finishing(outcome.code)   # what ran is decided: a late Ctrl-C/SIGTERM cannot split the document
    code = show(outcome, job)
    finishing.printed(code)
    # (not gc.freeze() here, which spared the exit's last cyclic collection its seconds on a large model: a review
    # showed a user's objects in a cycle then never finalized, a file they hold never flushed)
    raise typer.Exit(int(code))


def show(outcome, job) -> int:
    """The outcome on stdout/stderr: the result, or the error lines, the partial result and, under --json,
    the error document. Returns the exit code (a failure while printing is one more outcome)."""
    for line in outcome.lines:
        err(line)
    if outcome.trace and job.debug and (outcome.lines or outcome.message is None):
        sys.stderr.write(outcome.trace)
    if outcome.quiet:
        return outcome.code
    if outcome.message is None:
        from ..render import show as print_result

        try:
            to_stdout(lambda: print_result(outcome.result, job.render_spec(), outcome.logs))
            return outcome.code
        except BaseException as exc:   # noqa: B036 — the runner's ladder (outcome.failed) sorts it
            from ..runner.outcome import failed

            outcome = failed(exc, None, job.caller)
    if outcome.partial is not None and not job.json:   # what ran before the failure
        from ..render.console import print_result

        to_stdout(lambda: print_result(outcome.partial))
    report(outcome, job)
    if job.debug and outcome.trace:
        sys.stderr.write(outcome.trace)
    return outcome.code


def report(outcome, job) -> None:
    """`error:`/`hint:` lines, the error in the TensorBoard log, the --json error document."""
    err(f"error: {outcome.message}")
    if outcome.hint:
        err(f"hint: {outcome.hint}")
    tb = job.given("tb")
    if tb and outcome.code != 2:  # the log says what happened, and is flushed
        try:
            from ..render.tensorboard import write_error

            write_error(tb, job.command.name, outcome.message, outcome.hint, int(outcome.code))
        except Exception:  # never hide the real error behind a logging failure
            pass
    if job.json:
        import json

        from ..errors import UsageError
        from ..render.jsondoc import write_whole
        from ..results import error_document

        doc = error_document(job.command.name, outcome.message, outcome.hint, outcome.code, outcome.partial)
        doc.update(outcome.document)
        try:
            to_stdout(lambda: write_whole(json.dumps(doc) + "\n"))
        except UsageError as e:   # the error itself is said above; the exit code stays its own
            err(f"error: {e.message}")


def err(line: str) -> None:
    sys.stderr.write(line + "\n")


def progress(message: str, json_mode: bool):
    """A spinner on stderr when it is a terminal; silent otherwise (CI logs, --json)."""
    import contextlib

    if json_mode or not sys.stderr.isatty():
        return contextlib.nullcontext()
    from rich.console import Console

    return Console(stderr=True).status(message)


NOTICE_ENV = "TORCHDIAG_STILL_RUNNING"   # seconds before the first notice (default 60); 0 turns them off
NOTICE_EVERY = 120.0                     # seconds between the later ones


def _notice_after() -> float:
    """TORCHDIAG_STILL_RUNNING's seconds: 0 or less, or inf, off; not a number, the default 60 (a review: nan said
    "still running after 0 s" at once, 1e20 overflowed the timer's thread); between 0.05 s and a day."""
    import math

    try:
        value = float(os.environ.get(NOTICE_ENV, "60"))
    except ValueError:
        return 60.0
    if math.isnan(value):
        return 60.0
    return 0.0 if value <= 0 or value == math.inf else min(max(value, 0.05), 86400.0)


@contextlib.contextmanager
def still_running(message: str):
    """Around a diagnostic's run, where stderr is not a terminal (a CI log): one line after a minute, then every two,
    saying what it is doing (core/phase.py), so a re-check that takes minutes on a large model is not taken for a
    hang (a perf review: swinv2 gradflow and xcit doctor ran 4-10 silent minutes). A terminal's reader sees the
    process; commands with a live bar draw it there."""
    import threading
    import time

    from ..core import phase

    first = _notice_after()
    if first <= 0 or sys.stderr.isatty():
        yield
        return
    done, start = threading.Event(), time.monotonic()

    def notice() -> None:
        wait = first
        while not done.wait(wait):
            now, seconds = phase.current(), time.monotonic() - start
            took = f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"
            err(f"{message}: still running after {took}" + (f": {now}" if now else ""))
            wait = NOTICE_EVERY

    thread = threading.Thread(target=notice, name="torchdiag-notice", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()


def to_stdout(write: Callable[[], object]) -> None:
    """Run `write` (output on stdout) and flush. When the reader of stdout went away (| head, | true)
    the rest of our output and the final flush go to /dev/null, so exit keeps the command's own
    code and no BrokenPipeError or traceback follows (Rich turns a broken pipe into SystemExit(1))."""
    try:
        write()
        sys.stdout.flush()
    except (BrokenPipeError, SystemExit):
        _stdout_gone()
    except OSError as e:   # a full disk or a device that refuses (> /dev/full): a file error, said once on stderr
        from ..errors import UsageError

        _stdout_gone()
        raise UsageError(f"could not write the output to stdout: {e.strerror or e}",
                         "free space where stdout goes, or send it elsewhere") from None


def _stdout_gone() -> None:
    """The rest of our output, and the final flush, to /dev/null: nothing more can be written where stdout was."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # no real file descriptor (tests capture stdout)
        pass


def env_flag(name: str) -> bool:
    return os.environ.get(name, "").lower() in ("1", "true", "yes")


def output_file(path: Optional[Path], option: str, suffixes: tuple[str, ...] = ()) -> Optional[Path]:
    """render.output.check_file: a file the command will write, checked before any work (exit 2)."""
    from ..render.output import check_file

    return check_file(path, option, suffixes)
