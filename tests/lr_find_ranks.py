"""Launched by tests/test_lr_find.py under `torch.distributed.run --nproc_per_node 2`: lr-find through the
CLI's per-rank path (cli/torchrun.execute_ranks), until the command registry wires `torchdiag lr-find`.
Usage: lr_find_ranks.py MODEL_SPEC WRAP"""
import sys

import typer

from torchdiag.cli.common import CommonOptions
from torchdiag.cli.torchrun import execute_ranks
from torchdiag.core.distributed import current
from torchdiag.diagnostics import lr_find as diag

spec, wrap = sys.argv[1], sys.argv[2]
opts = CommonOptions("lr-find", spec, device="cpu", json=True, optimizer={"name": "sgd"}, wrap=wrap)
try:
    execute_ranks(opts, current(), diag, lambda: diag.Options(steps=30, repeats=2, check_steps=5))
except typer.Exit as e:
    sys.exit(e.exit_code)
