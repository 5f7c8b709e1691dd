"""profile's options: torch-free, validated when built (before any model is loaded)."""
from __future__ import annotations

from dataclasses import dataclass

from ...core.run import OptimizerSpec, choice, flag, number

MODES = ("inference", "train")
# under torchrun: how each --wrap reaches this command (runner/ranks.py: wrap_mode)
WRAP = {"ddp": ("train", ""), "fsdp": ("train", "")}
NEEDS_VALUES = True                               # meta tensors have no timing: core refuses meta once
OPTIMIZER = OptimizerSpec("adam", lr=1e-3)        # train mode; lr 1e-3 for every optimizer, sgd momentum 0.9

# the profiler keeps every recorded event in memory (a sweep: --active 1e11 grew to 11 GB before a timeout): steps
# beyond this are no measurement anyone needs from one command
MAX_STEPS = 10_000
STEPS = ("wait", "warmup", "active")


@dataclass
class Options:
    mode: str | None = None       # None: inference, or train under torchrun --wrap ddp|fsdp (session.resolved)
    wait: int = 1
    warmup: int = 2
    active: int = 5
    top: int = 15                 # 0 lists every operator
    record_shapes: bool = False
    memory: bool = False
    trace: bool = False           # keep the Chrome trace in result.artefacts["trace"] (--trace, --tb)
    depth: int = 3
    syncs: bool = False           # one more step under host-sync detection: the `syncs` table (profile/syncs.py)

    def __post_init__(self):
        if self.mode is not None:
            self.mode = choice("mode", self.mode, MODES)
        for name, low in (("wait", 0), ("warmup", 0), ("active", 1), ("top", 0), ("depth", 0)):
            number(name, getattr(self, name), low=low, integer=True, high=MAX_STEPS if name in STEPS else None)
        flag("trace", self.trace, "torchdiag.render.profile.write_trace")  # it once took a path
        flag("syncs", self.syncs)

    @property
    def total_steps(self) -> int:
        return self.wait + self.warmup + self.active
