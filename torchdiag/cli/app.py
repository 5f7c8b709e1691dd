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


def main() -> None:
    app()
