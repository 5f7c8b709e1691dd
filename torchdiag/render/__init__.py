"""Renderers read Result objects; they never run models. Every file torchdiag writes is written here."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class RenderSpec:
    """How to show a result: torch-free, built by the CLI (or `check`) from its own options."""

    command: str
    json: bool = False
    tb: str | None = None        # TensorBoard folder
    outputs: dict[str, str] = field(default_factory=dict)   # kind (plot, trace, images, ...) -> path asked for


def write_outputs(result, out: RenderSpec) -> dict[str, str]:
    """Every file the user asked for besides TensorBoard: kind K is written by the command's renderer
    (commands.py names it), `WRITERS[K](result, path) -> str`, through render/output.py. Returns kind -> path."""
    from ..commands import get

    asked = {kind: path for kind, path in out.outputs.items() if path is not None}
    if not asked:
        return {}
    writers = get(out.command).renderer_module().WRITERS
    written = {kind: writers[kind](result, path) for kind, path in asked.items()}
    return {kind: path for kind, path in written.items() if path}   # "": nothing to write (said by the command)


def render(result, out: RenderSpec) -> None:
    """TensorBoard first, then stdout: nothing may fail after the JSON document is printed."""
    show(result, out, write_tensorboard(result, out))


def write_tensorboard(result, out: RenderSpec) -> str | None:
    """The result's TensorBoard events under out.tb (None when not asked for); returns the folder written."""
    if not out.tb:
        return None
    from ..commands import BY_NAME

    command = BY_NAME.get(out.command)
    renderer = command.renderer_module() if command is not None else None
    if getattr(renderer, "TENSORBOARD_LIVE", False):   # written while the run went (watch): not again
        from pathlib import Path

        return str(Path(out.tb) / out.command)
    from .tensorboard import write_result

    return write_result(result, out.tb)


def show(result, out: RenderSpec, logs: str | None = None) -> None:
    """The result on stdout: one JSON document, or the console report (and where the TensorBoard `logs` went)."""
    if out.json:
        from .jsondoc import print_json

        print_json(result)
    else:
        from .console import print_result

        print_result(result)
        if logs is not None:
            import sys

            sys.stderr.write(f"TensorBoard logs: {logs}  (tensorboard --logdir {out.tb})\n")
