"""overfit-batch's options (torch-free, validated when built, before any model is loaded) and what the
runner needs to know of the command."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ...core.run import OptimizerSpec, number
from ...errors import OptionError

NEEDS_VALUES = True
# under torchrun: how each --wrap reaches this command (runner/ranks.py: wrap_mode)
WRAP = {"ddp": ("train", "the copy overfit-batch trains; its stop is agreed across ranks each step, the causes "
                         "are checked on a local copy"),
        "fsdp": ("train", "the copy overfit-batch trains is sharded by fully_shard; each rank's loss is on its own "
                          "rows, the stop is agreed across ranks each step, the causes are checked on a local copy "
                          "of the gathered weights")}
OPTIMIZER = OptimizerSpec("adam")     # lr None: DEFAULT_LR (adam/adamw 1e-3, sgd 1e-2); sgd momentum 0.9
DEFAULT_STEPS = 500
EXTEND = 4      # without --steps: up to EXTEND × DEFAULT_STEPS while the loss's trend still predicts the target
RATIO_HINT = "e.g. 0.01: pass when the loss falls to 1% of its initial value"


@dataclass
class Options:
    """overfit-batch's own options (the names of its pyproject keys, with _ for -). Validated here,
    before any model is loaded, for every caller (CLI, Python, `check`)."""

    # None: DEFAULT_STEPS, extended (to EXTEND × that at most) while the loss still falls toward the target;
    # a number given is a hard budget (a run still falling at its end gets the warning not-overfit-yet)
    steps: int | None = None
    target_ratio: float = 0.01
    target_loss: float | None = None
    max_names: int = 10
    # Progress callback (step, loss) after each loss evaluation: plain Python, holds no torch state,
    # so it stays an option (the CLI's live bar uses it).
    on_step: Callable[[int, float], None] | None = None
    # Called with the new step budget when a run still falling toward the target is extended (loop._extend).
    on_budget: Callable[[int], None] | None = None

    @property
    def budget(self) -> int:
        """The first step budget: --steps, or DEFAULT_STEPS."""
        return DEFAULT_STEPS if self.steps is None else self.steps

    @property
    def cap(self) -> int:
        """The most steps a run may take: the budget, or EXTEND × DEFAULT_STEPS when --steps is left out."""
        return EXTEND * DEFAULT_STEPS if self.steps is None else self.steps

    def __post_init__(self):
        if self.steps is not None:
            number("steps", self.steps, low=1, integer=True)
        number("target_ratio", self.target_ratio)
        if not 0 < self.target_ratio < 1:
            raise OptionError("target_ratio", f"must be between 0 and 1, got {self.target_ratio!r}", hint=RATIO_HINT)
        if self.target_loss is not None:
            number("target_loss", self.target_loss)
        number("max_names", self.max_names, low=1, integer=True)
        if self.on_step is not None and not callable(self.on_step):
            raise OptionError("on_step", f"{self.on_step!r} is not callable", hint="fn(step, loss) or None")
        if self.on_budget is not None and not callable(self.on_budget):
            raise OptionError("on_budget", f"{self.on_budget!r} is not callable", hint="fn(steps) or None")
