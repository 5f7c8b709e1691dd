"""The `torchdiag` command: global options, command registration, entry point.

Commands are loaded when one runs: `torchdiag nancheck ...` imports cli/nancheck.py only, and
`torchdiag --help` lists the commands from the registry (commands.py) without importing any of them."""
from __future__ import annotations

import contextlib
import functools
from collections.abc import Mapping
from typing import Annotated

import typer
from typer.core import TyperGroup

from .. import __version__
from ..commands import COMMANDS as REGISTRY
from ..commands import NAMES, get

EXIT_CODES = """Exit codes: 0 ran, nothing failed · 1 a check failed · 2 usage error (option, spec, shape, file, device) · 3 the model's own code raised · 4 internal torchdiag error · 130 interrupted (Ctrl-C) · 143 terminated (SIGTERM)."""

# The command list, its order and each command's summary (the first paragraph of its help, shown by
# `torchdiag --help` without importing any command) come from the registry.
COMMANDS = list(NAMES)
SUMMARIES = {c.name: c.summary for c in REGISTRY}


@functools.cache
def load_command(name: str):
    """The click command of `name`, built from cli/<name>.py on first use."""
    sub = typer.Typer(add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None)
    get(name).cli_module().register(sub)
    return typer.main.get_command(sub)


class _Commands(Mapping):
    """Group.commands, filled on demand."""

    def __getitem__(self, name):
        if name not in COMMANDS:
            raise KeyError(name)
        return load_command(name)

    def __iter__(self):
        return iter(COMMANDS)

    def __len__(self) -> int:
        return len(COMMANDS)


class LazyGroup(TyperGroup):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.commands = _Commands()

    def list_commands(self, ctx) -> list[str]:
        return list(COMMANDS)

    def format_commands(self, ctx, formatter) -> None:
        """As click lays it out, from SUMMARIES: listing the commands imports none of them."""
        try:  # typer ≥ 0.20 vendors click; older typer uses the click package
            from typer._click.utils import make_default_short_help
        except ImportError:
            from click.utils import make_default_short_help
        limit = formatter.width - 6 - max(len(name) for name in COMMANDS)
        with formatter.section("Commands"):
            formatter.write_dl([(name, make_default_short_help(SUMMARIES[name], limit)) for name in COMMANDS])


app = typer.Typer(
    cls=LazyGroup,
    name="torchdiag",
    help="Diagnostics for PyTorch models: point it at MODEL_SPEC (file.py:factory or module:factory).",
    epilog=EXIT_CODES,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    rich_markup_mode=None,
)

def _version(value: bool) -> None:
    if value:
        typer.echo(f"torchdiag {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: Annotated[bool | None, typer.Option("--version", callback=_version, is_eager=True,
                                                         help="Show the version and exit.")] = None) -> None:
    """Diagnostics for PyTorch models."""


def _usable_streams() -> None:
    """A closed stdout/stderr (`>&-`) becomes /dev/null, and a character the terminal's encoding lacks
    (PYTHONIOENCODING=ascii and our "—") is replaced instead of raising."""
    import os
    import sys

    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is None:
            setattr(sys, name, open(os.devnull, "w"))
        else:
            try:
                stream.reconfigure(errors="replace")
            except (AttributeError, ValueError):
                pass


def _reports() -> bool:
    """Not a rank other than 0 under torchrun (core.distributed.current(): torch-free)."""
    from ..core.distributed import current

    ranks = current()
    return ranks is None or ranks.main


def main() -> None:
    """Entry point. Option errors Click catches (unknown option, bad value) get the same
    `error:`/`hint:` lines, exit code 2 and --json error document as every other usage error."""
    import sys

    _usable_streams()
    import faulthandler

    with contextlib.suppress(Exception):   # a crash in native code (a segfault in a dataset read in-process) says
        faulthandler.enable()              # where, instead of an empty stderr and exit 139 (a review)

    from ..runner.isolation import sigterm_raises, unreported_interrupt

    sigterm_raises()   # from here a SIGTERM ends as Ctrl-C does (exit 143, the --json error document)
    try:  # typer ≥ 0.20 vendors click; older typer uses the click package
        from typer._click import exceptions as cx
    except ImportError:
        from click import exceptions as cx

    try:
        code = app(standalone_mode=False)
        if code == 130 and (late := unreported_interrupt()):
            code = _interrupted(late)
    except cx.NoArgsIsHelpError as e:
        # `torchdiag` alone asks for the overview (0); a command with nothing to run on is a usage error (2), so a
        # CI line that lost its model spec fails instead of passing on the help text (a review)
        sub = e.ctx is not None and e.ctx.parent is not None
        (sys.stderr if sub else sys.stdout).write((e.ctx.get_help() if e.ctx else "") + "\n")
        code = 2 if sub else 0
    except cx.UsageError as e:
        command = e.ctx.command_path if e.ctx else "torchdiag"
        if not _reports():   # under torchrun every rank parses the same line: rank 0 says it once
            sys.exit(2)
        sys.stderr.write(f"error: {e.format_message()}\nhint: see `{command} --help`\n")
        if "--json" in sys.argv[1:]:
            name = e.ctx.command.name if e.ctx and e.ctx.command else None
            _json_error(name, e.format_message(), f"see `{command} --help`", 2)
        code = 2
    except (getattr(cx, "Abort", KeyboardInterrupt), KeyboardInterrupt):  # vendored click has no Abort
        code = _interrupted(unreported_interrupt() or 130)
    sys.exit(code or 0)


def _interrupted(code: int) -> int:
    """Ctrl-C (130) or SIGTERM (143) before a command's runner took over: the error line, and the --json error
    document, as after it. Returns the code."""
    import sys

    from ..errors import ExitCode

    message = "terminated (SIGTERM)" if code == ExitCode.TERMINATED else "interrupted"
    sys.stderr.write(f"error: {message}\n")
    if "--json" in sys.argv[1:]:
        name = next((a for a in sys.argv[1:] if not a.startswith("-")), None)
        _json_error(name if name in NAMES else None, message, None, code)
    return code


def _json_error(name: str | None, message: str, hint: str | None, code: int) -> None:
    import json

    from ..render.jsondoc import write_whole
    from ..results import error_document
    from .common import to_stdout

    doc = error_document(name, message, hint, code)
    to_stdout(lambda: write_whole(json.dumps(doc) + "\n"))
