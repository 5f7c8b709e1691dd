"""`torchdiag attention`: attention weights per layer and head, as numbers and heatmaps."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from . import common as c

EXAMPLE = """Examples:

  torchdiag attention sample_models/vit.py:build -i 1x3x32x32 --images out/attn

  torchdiag attention sample_models/transformer_lm.py:build -i 1x8:int64 --tokens the,cat,sat,on,the,mat,.,EOS --images out/attn

  torchdiag attention sample_models/vit.py:build --tb runs --json"""

Tokens = Annotated[Optional[str], typer.Option("--tokens", metavar="A,B,…|@FILE", show_default=False,
                                               help="Token labels for the axes: comma-separated, or @FILE with one per line.")]
Images = Annotated[Optional[Path], typer.Option("--images", metavar="DIR", show_default=False,
                                                help="Write attention_<layer>.png (one heatmap per head) into DIR.")]
Sample = Annotated[int, typer.Option("--sample", help="Which batch element to draw (0 = the first).")]


def _tokens(text):
    from ..errors import UsageError

    if text is None:
        return None
    if text.startswith("@"):
        p = Path(text[1:])
        if not p.is_file():
            raise UsageError(f"tokens file not found: {p}")
        try:
            return [line.rstrip("\n") for line in p.read_text(encoding="utf-8").splitlines()]
        except UnicodeDecodeError as exc:
            raise UsageError(f"--tokens {p}: not UTF-8 text (byte {exc.start})",
                             hint="save the token file as UTF-8, one token per line") from None
        except OSError as exc:
            raise UsageError(f"--tokens {p}: cannot read it: {exc.strerror or exc}") from None
    return [t.strip() for t in text.split(",")]


def register(app) -> None:
    @app.command("attention", epilog=EXAMPLE, no_args_is_help=True)
    def attention(spec: c.Spec, tokens: Tokens = None, images: Images = None, sample: Sample = 0,
                  arg: c.Args = None, input: c.Inputs = None, device: c.Device = "auto", seed: c.Seed = 0,
                  json: c.Json = False, tb: c.Tb = None, debug: c.Debug = False, checkpoint: c.Checkpoint = None, strict_checkpoint: c.StrictCheckpoint = True) -> None:
        """Attention weights of every nn.MultiheadAttention (and of modules that return attention
        weights, and of F.scaled_dot_product_attention calls) for one forward pass.

        Per head: entropy, mean max weight, weight on the first key and on the diagonal. With
        --images/--tb: a heatmap per layer with one panel per head (queries × keys), labelled with
        --tokens when given."""
        from ..diagnostics import attention as diag
        from ..render.attention import record

        opts = c.CommonOptions("attention", spec, arg or [], input or [], device, seed, json, tb, debug,
                               outputs={"images": images}, checkpoint=checkpoint, strict_checkpoint=strict_checkpoint)

        def precheck():   # before loading anything
            from ..render.images import check_pictures

            check_pictures(images, tb is not None, "attention pictures")

        c.execute(opts, diag, lambda: diag.Options(tokens=_tokens(tokens), images=images is not None,
                                                   tb=tb is not None, sample=sample),
                  render_extra=record, precheck=precheck)
