"""`torchdiag attention`: attention weights per layer and head, as numbers and heatmaps."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from . import common as c

EXAMPLE = """Examples:

  torchdiag attention sample_models/vit.py:build -i 1x3x32x32 --images out/attn

  torchdiag attention sample_models/transformer_lm.py:build -i 1x8:int64 --tokens the,cat,sat,on,the,mat,.,EOS --images out/attn

  torchdiag attention sample_models/vit.py:build --tb runs --json"""

Tokens = Annotated[str | None, typer.Option("--tokens", metavar="A,B,…|@FILE", show_default=False,
                                               help="Token labels for the axes: comma-separated, or @FILE with one per line.")]
Images = Annotated[Path | None, typer.Option("--images", parser=c.nonempty_path, metavar="DIR", show_default=False,
                                                help="Write attention_<layer>.png (one heatmap per head) into DIR.")]
Sample = Annotated[int, typer.Option("--sample", help="Which batch element to draw (0 = the first).")]


def _tokens(text):
    from ..errors import UsageError

    if text is None:
        return None
    if text.startswith("@"):
        p = Path(text[1:])
        if not p.is_file():
            if p.exists():   # a folder, device or FIFO: said as what it is (a sweep: "not found")
                from ..core.limits import regular_file

                regular_file(str(p), "--tokens", hint="give a text file, one token per line: --tokens @tokens.txt")
            raise UsageError(f"tokens file not found: {p}")
        try:
            return [line.rstrip("\n") for line in p.read_text(encoding="utf-8").splitlines()]
        except UnicodeDecodeError as exc:
            raise UsageError(f"--tokens {p}: not UTF-8 text (byte {exc.start})",
                             hint="save the token file as UTF-8, one token per line") from None
        except OSError as exc:
            raise UsageError(f"--tokens {p}: cannot read it: {exc.strerror or exc}") from None
    return [t.strip() for t in text.split(",")] if text.strip() else []   # "": no labels, not one empty one


DETAILS = """Per head: entropy, mean max weight, weight on the first key and on the diagonal. With
--images/--tb: a heatmap per layer with one panel per head (queries × keys), labelled with
--tokens when given."""

OWN = {"tokens": (Tokens, None), "images": (Images, None), "sample": (Sample, 0)}


def run(o) -> None:
    from ..diagnostics import attention as diag
    from ..render.attention import record

    def precheck():   # before loading anything
        from ..render.images import check_pictures

        check_pictures(o.images, o.tb is not None, "attention pictures")

    job = c.job("attention", o, outputs={"images": o.images}, precheck=precheck,
                options=lambda: diag.Options(tokens=_tokens(o.tokens), images=o.images is not None,
                                             tb=o.tb is not None, sample=o.sample))
    c.execute(job, render_extra=record)


def register(app) -> None:
    c.register(app, "attention", run, OWN, DETAILS, EXAMPLE)
