"""doctor's options (torch-free) and what the runner needs to know of the command."""
from __future__ import annotations

from dataclasses import dataclass

from ...core.run import OptimizerSpec

NEEDS_VALUES = False   # partly useful on meta: the value checks skip themselves there
OPTIMIZER = OptimizerSpec("adam", lr=1e-3)   # the one-step update check
# under torchrun: how each --wrap reaches doctor (runner/ranks.py: wrap_mode); see wrapped.py
WRAP = {"ddp": ("pass", "the training checks (train-mode forward, backward, one optimizer step) run on the DDP "
                        "copy, gradients after its reduction; the eval checks and re-checks on this rank's own copy"),
        "fsdp": ("pass", "the training checks (train-mode forward, backward, one optimizer step) run on the "
                         "fully_shard copy, each parameter judged whole across ranks; the eval checks and re-checks "
                         "on this rank's own copy")}


@dataclass
class Options:
    """doctor has no settings of its own: loss, target, seed and the optimizer of the one-step update
    check come from the run (ctx)."""
