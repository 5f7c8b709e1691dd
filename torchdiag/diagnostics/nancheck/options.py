"""nancheck's options (torch-free, validated when built) and what the runner needs to know of the command."""
from __future__ import annotations

from dataclasses import dataclass

from ...core.run import OptimizerSpec, number
from ...errors import OptionError

NEEDS_VALUES = True
# under torchrun: how each --wrap reaches this command (runner/ranks.py: wrap_mode)
WRAP = {"ddp": ("pass", "the main pass runs on the DDP copy, gradients after its reduction; locating a "
                        "non-finite value runs on this rank's own model"),
        "fsdp": ("pass", "the main pass runs on the fully_shard copy, gradients after its reduce-scatter (each "
                         "rank checks its shard, the ranks agree); locating a non-finite value runs on this "
                         "rank's own model")}
OPTIMIZER = OptimizerSpec("sgd", lr=0.01, momentum=0.0)   # --steps: plain SGD, no momentum


@dataclass(frozen=True)
class Options:
    steps: int = 0           # optimizer steps on a copy (optimizer and lr come from the run spec)
    anomaly: bool = False

    def __post_init__(self):
        number("steps", self.steps, low=0, integer=True)
        if not isinstance(self.anomaly, bool):
            raise OptionError("anomaly", f"{self.anomaly!r} is not true or false")
