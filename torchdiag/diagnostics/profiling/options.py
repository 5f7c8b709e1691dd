"""profile's options: torch-free, validated when built (before any model is loaded)."""
from __future__ import annotations

from dataclasses import dataclass

from ...core.run import OptimizerSpec, choice, number
from ...errors import OptionError

MODES = ("inference", "train")
NEEDS_VALUES = True                               # meta tensors have no timing: core refuses meta once
OPTIMIZER = OptimizerSpec("adam", lr=1e-3)        # train mode; lr 1e-3 for every optimizer, sgd momentum 0.9


@dataclass
class Options:
    mode: str = "inference"
    wait: int = 1
    warmup: int = 2
    active: int = 5
    top: int = 15                 # 0 lists every operator
    record_shapes: bool = False
    memory: bool = False
    trace: bool = False           # keep the Chrome trace in result.artefacts["trace"] (--trace, --tb)
    depth: int = 3

    def __post_init__(self):
        self.mode = choice("mode", self.mode, MODES)
        number("wait", self.wait, low=0, integer=True)
        number("warmup", self.warmup, low=0, integer=True)
        number("active", self.active, low=1, integer=True)
        number("top", self.top, low=0, integer=True)
        number("depth", self.depth, low=0, integer=True)
        if not isinstance(self.trace, bool):   # a path: files are the renderer's (render/profile.py)
            raise OptionError("trace", f"is yes/no (got {self.trace!r})",
                              hint="trace=True keeps the trace in result.artefacts['trace']; write it with "
                                   "torchdiag.render.profile.write_trace(result, path)")

    @property
    def total_steps(self) -> int:
        return self.wait + self.warmup + self.active
