"""The `torchdiag` command: global options, command registration, entry point."""
from __future__ import annotations

import importlib
import importlib.util
from typing import Annotated, Optional

import typer

from .. import __version__

EXIT_CODES = """Exit codes: 0 ran, nothing failed · 1 a check failed · 2 usage error (option, spec, shape, file, device) · 3 the model's own code raised · 4 internal torchdiag error · 130 interrupted."""

app = typer.Typer(
    name="torchdiag",
    help="Diagnostics for PyTorch models: point it at MODEL_SPEC (file.py:factory or module:factory).",
    epilog=EXIT_CODES,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    rich_markup_mode=None,
)

# One name through every layer: command `overfit-batch` lives in cli/overfit_batch.py.
COMMANDS = ["summary", "flops", "nancheck", "gradflow", "overfit-batch", "profile", "memory", "doctor",
            "activations", "gradcam", "attention", "embeddings", "gradcheck", "check"]


def _version(value: bool) -> None:
    if value:
        typer.echo(f"torchdiag {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: Annotated[Optional[bool], typer.Option("--version", callback=_version, is_eager=True,
                                                         help="Show the version and exit.")] = None) -> None:
    """Diagnostics for PyTorch models."""


for _name in COMMANDS:
    _module = f"{__package__}.{_name.replace('-', '_')}"
    if importlib.util.find_spec(_module) is not None:
        importlib.import_module(_module).register(app)


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


def main() -> None:
    """Entry point. Option errors Click catches (unknown option, bad value) get the same
    `error:`/`hint:` lines, exit code 2 and --json error document as every other usage error."""
    import sys

    _usable_streams()

    try:  # typer ≥ 0.20 vendors click; older typer uses the click package
        from typer._click import exceptions as cx
    except ImportError:
        from click import exceptions as cx

    try:
        code = app(standalone_mode=False)
    except cx.NoArgsIsHelpError as e:
        sys.stdout.write((e.ctx.get_help() if e.ctx else "") + "\n")
        code = 0
    except cx.UsageError as e:
        command = e.ctx.command_path if e.ctx else "torchdiag"
        sys.stderr.write(f"error: {e.format_message()}\nhint: see `{command} --help`\n")
        if "--json" in sys.argv[1:]:
            import json

            name = e.ctx.command.name if e.ctx and e.ctx.command else None
            from .common import to_stdout

            from ..results import error_document

            doc = error_document(name, e.format_message(), f"see `{command} --help`", 2)
            to_stdout(lambda: sys.stdout.write(json.dumps(doc) + "\n"))
        code = 2
    except (getattr(cx, "Abort", KeyboardInterrupt), KeyboardInterrupt):  # vendored click has no Abort
        sys.stderr.write("error: interrupted\n")
        code = 130
    sys.exit(code or 0)
