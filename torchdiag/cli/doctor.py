"""`torchdiag doctor`: the silent-killer checklist (device, in-place, modes, updates, dtypes, inputs)."""
from __future__ import annotations

from . import common as c

EXAMPLE = """Examples:

  torchdiag doctor sample_models/cnn.py:build -i 8x3x32x32

  torchdiag doctor sample_models/broken_doctor_device.py:build --json

  torchdiag doctor model.py:build --batch model.py:batch --loss cross_entropy --tb runs/

  torchdiag doctor sample_models/precision_steps.py:rounds_away --dtype bfloat16 --loss sum"""


DETAILS = """Each check gives a verdict, the module or parameter concerned, and a hint: tensors created in
forward without a device (found on the meta device, no GPU needed) and parameters on several
devices (device-mismatch); in-place edits that break backward (inplace-autograd); Dropout/
BatchNorm modes (mode-dependent), BatchNorm with batch size 1 (batchnorm-batch-1), BatchNorm running
statistics that keep the last batch or never move (batchnorm-momentum), eval output
that changes between runs (nondeterministic-eval); parameters that get a gradient but do not
change after an optimizer step (param-not-updated), bf16/fp16 weights whose update rounds away
(update-rounds-away: --dtype, or a model built in them) and frozen ones (frozen); mixed dtypes
(dtype-mismatch); input statistics, raw [0, 255] images (unnormalised-input), and class targets
from --batch beyond the output width (target-out-of-range). --amp runs the forwards under
autocast (fp16: the step through a GradScaler). Everything that runs the model works on a copy.
Exit 1 when any check finds an error."""

OWN: dict = {}


def run(o) -> None:
    from ..diagnostics import doctor as diag

    # the factory (meta rebuild), --batch target, loss, seed and the update check's optimizer
    # (doctor.OPTIMIZER) reach doctor through the run context
    c.execute(c.job("doctor", o, options=diag.Options))


def register(app) -> None:
    c.register(app, "doctor", run, OWN, DETAILS, EXAMPLE)
