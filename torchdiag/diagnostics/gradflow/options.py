"""gradflow's options (torch-free, validated when built) and its status vocabulary."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ...core.run import OptimizerSpec, number
from ...errors import OptionError

NEEDS_VALUES = True
# under torchrun: how each --wrap reaches this command (runner/ranks.py: wrap_mode)
WRAP = {"ddp": ("pass", "the judged pass runs on the DDP copy, gradients after its reduction; the re-checks "
                        "run on this rank's own model"),
        "fsdp": ("pass", "the judged pass runs on the fully_shard copy, gradients after its reduce-scatter, "
                         "gathered whole; the re-checks run on this rank's own model")}

# status → severity when flagged (errors fail; warnings fail only with strict). zero-init, invariant
# and by-design-init are "by design at initialisation" (recheck.py, gated.py): info, with the cause.
STATUS_SEVERITY = {
    "non-finite-grad": "error", "no-grad": "error", "zero-grad": "error", "exploding-grad": "error",
    "vanishing-grad": "warning", "zero-init": "info", "invariant": "info", "by-design-init": "info",
    "adaptive-step": "info", "bounded-step": "info", "transient-grad": "info", "small-weight": "info",
    "small-term": "info", "small-normalised": "info", "cancelled": "info", "loss-scale": "info", "skipped-at-random": "info", "routed-by-input": "info", "closed-on-batch": "info", "frozen": "info", "not-reached": "info", "ok": None,
}
# adaptive-step / bounded-step: a small gradient the re-check's optimizer steps like the rest, a large
# grad/weight it does not turn into a large step (gated.py): info as well
BY_DESIGN = ("zero-init", "invariant", "by-design-init", "skipped-at-random", "routed-by-input", "closed-on-batch", "adaptive-step", "bounded-step",
             "transient-grad", "small-weight", "small-term", "small-normalised", "cancelled", "loss-scale")
# the worst status first: a layer shows the worst of its parameters
STATUS_ORDER = ["non-finite-grad", "no-grad", "zero-grad", "exploding-grad", "vanishing-grad", *BY_DESIGN,
                "not-reached", "ok", "frozen"]

OPTIMIZER = OptimizerSpec("adam")   # the short training run that re-checks a flagged finding (gates.py)


@dataclass
class Options:
    depth: int = 3
    vanishing: float = 1e-7          # grad/weight ratio (grad norm when the weight is all zeros) below → vanishing
    exploding: float = 1e3           # grad norm above → exploding
    exploding_ratio: float = 1e2     # grad/weight ratio above → exploding
    dead: float = 0.5                # fraction of dead units after a ReLU-family module → warning
    saturated: float = 0.5           # fraction of saturated outputs after tanh/sigmoid → warning
    saturation_margin: float = 0.01  # tanh |y| > 1 - m, sigmoid y < m or y > 1 - m
    allow: list[str] = field(default_factory=list)
    strict: bool = False
    eval_mode: bool = False
    histograms: bool = False         # fill result.histograms (for --tb)
    all: bool = False                # print the per-parameter table (always in JSON)

    def __post_init__(self):
        number("depth", self.depth, low=0, integer=True)
        for name in ("vanishing", "exploding", "exploding_ratio"):
            value = getattr(self, name)
            if not (isinstance(value, float) and value == math.inf):   # inf: the check is off
                number(name, value, low=0)
        for name in ("dead", "saturated"):
            number(name, getattr(self, name), low=0, high=1)
        number("saturation_margin", self.saturation_margin, low=0, high=0.5)
        if isinstance(self.allow, str):   # one pattern given as a string, not its characters
            self.allow = [self.allow]
        self.allow = list(self.allow or [])
        if not all(isinstance(p, str) for p in self.allow):
            raise OptionError("allow", f"{self.allow!r} is not a list of glob patterns",
                              hint="e.g. allow=['aux_head.*', 'block.scale']")
        for name, flag in (("strict", None), ("eval_mode", "--eval"), ("histograms", "--tb"), ("all", "--all")):
            if not isinstance(getattr(self, name), bool):
                raise OptionError(name, f"{getattr(self, name)!r} is not true or false", flag=flag)
