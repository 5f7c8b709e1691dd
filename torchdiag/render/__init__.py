"""Renderers read Result objects; they never run models."""
from __future__ import annotations


def render(result, opts) -> None:
    """TensorBoard first, then stdout: nothing may fail after the JSON document is printed."""
    path = None
    if opts.tb:
        from .tensorboard import write_result

        path = write_result(result, opts.tb)
    if opts.json:
        from .jsondoc import print_json

        print_json(result)
    else:
        from .console import print_result

        print_result(result)
        if path is not None:
            import sys

            sys.stderr.write(f"TensorBoard logs: {path}  (tensorboard --logdir {opts.tb})\n")
